# lib.mk - the installable library (included by the Makefile; docs/library.md).
#   make lib        BUILD/libagentkv.so (soname libagentkv.so.MAJOR) and BUILD/pub/libagentkv.a:
#                   only include/agentkv.h's functions exported
#   make install    PREFIX=/usr/local (DESTDIR=... to stage): bin/agentkv, lib/libagentkv.{a,so*},
#                   include/agentkv.h, lib/pkgconfig/agentkv.pc, share/man/man1/agentkv.1
#   make uninstall  removes what install put there
#
# The shared library is linked from a PIC copy of the library's objects in
# BUILD/pic/, compiled with hidden visibility: AGENTKV_API (the header's
# default visibility) marks the only symbols it exports. A dispatched build
# (ARCH=dispatch) gives the copy its own per-level objects, maps and jump
# stubs (scripts/dispatch.sh; the stubs are hidden), so the .so picks the
# SIMD level at run time as the binary does. The installed static archive is
# one relocatable object of the same PIC objects with every hidden symbol
# made local (objcopy --localize-hidden): a program linking it statically
# sees the header's functions and nothing else either.

AK_VERSION  := $(shell sed -n 's/^\#define AGENTKV_VERSION "\(.*\)"/\1/p' include/agentkv.h)
AK_SOMAJOR  := $(firstword $(subst ., ,$(AK_VERSION)))
AK_SONAME   := libagentkv.so.$(AK_SOMAJOR)
AK_SO       := $(BUILD)/libagentkv.so.$(AK_VERSION)
AK_PUB_A    := $(BUILD)/pub/libagentkv.a
AK_MAN      := $(BUILD)/agentkv.1

PREFIX      ?= /usr/local
BINDIR      ?= $(PREFIX)/bin
LIBDIR      ?= $(PREFIX)/lib
INCLUDEDIR  ?= $(PREFIX)/include
MANDIR      ?= $(PREFIX)/share/man
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
DESTDIR     ?=

PIC         := $(BUILD)/pic
PIC_FLAGS   := -fPIC -fvisibility=hidden
PIC_OBJ     := $(patsubst $(BUILD)/%,$(PIC)/%,$(LIB_OBJ))

$(PIC)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PIC_FLAGS) -c $< -o $@

$(PIC)/gen/console_assets.o: $(CONSOLE_C)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PIC_FLAGS) -c $< -o $@

$(PIC)/src/kv/kvcache.o $(DSP_LEVELS:%=$(PIC)/dsp/%/raw/src/kv/kvcache.o): CFLAGS += -ffp-contract=fast

ifneq ($(DSP),)
$(PIC)/src/base/cpu.o: CFLAGS += -DAK_DISPATCH
PIC_DSP_RAW := $(foreach L,$(DSP_LEVELS),$(DSP_SRC:%.c=$(PIC)/dsp/$(L)/raw/%.o))

$(foreach L,$(DSP_LEVELS),$(eval $(call DSP_LEVEL_RULES,$(L),$(PIC),$(PIC_FLAGS))))
$(eval $(call DSP_STUB_RULES,$(PIC)))
endif

$(AK_SO): $(PIC_OBJ)
	$(CC) $(CFLAGS) -shared -Wl,-soname,$(AK_SONAME) -Wl,--no-undefined -o $@ $^ $(LDLIBS)
$(BUILD)/$(AK_SONAME): $(AK_SO)
	ln -sf $(notdir $<) $@
$(BUILD)/libagentkv.so: $(BUILD)/$(AK_SONAME)
	ln -sf $(notdir $<) $@

$(AK_PUB_A): $(PIC_OBJ)
	@mkdir -p $(dir $@)
	$(CC) -r -nostdlib -o $(BUILD)/pub/agentkv.o $^
	$(OBJCOPY) --localize-hidden $(BUILD)/pub/agentkv.o
	@rm -f $@
	ar rcs $@ $(BUILD)/pub/agentkv.o

# The man page, from the binary's own --help and each command's.
$(AK_MAN): $(BUILD)/agentkv scripts/manpage.sh
	sh scripts/manpage.sh $(BUILD)/agentkv $(AK_VERSION) > $@.tmp && mv $@.tmp $@

lib: $(BUILD)/libagentkv.so $(AK_PUB_A)

install: lib $(BUILD)/agentkv $(AK_MAN)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(PKGCONFIGDIR) $(DESTDIR)$(INCLUDEDIR) \
	    $(DESTDIR)$(MANDIR)/man1
	install -m 755 $(BUILD)/agentkv $(DESTDIR)$(BINDIR)/agentkv
	install -m 644 $(AK_PUB_A) $(DESTDIR)$(LIBDIR)/libagentkv.a
	install -m 755 $(AK_SO) $(DESTDIR)$(LIBDIR)/libagentkv.so.$(AK_VERSION)
	ln -sf libagentkv.so.$(AK_VERSION) $(DESTDIR)$(LIBDIR)/$(AK_SONAME)
	ln -sf $(AK_SONAME) $(DESTDIR)$(LIBDIR)/libagentkv.so
	install -m 644 include/agentkv.h $(DESTDIR)$(INCLUDEDIR)/agentkv.h
	install -m 644 $(AK_MAN) $(DESTDIR)$(MANDIR)/man1/agentkv.1
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' \
	    -e 's|@VERSION@|$(AK_VERSION)|' -e 's|@LIBS_PRIVATE@|$(strip $(LDLIBS))|' scripts/agentkv.pc.in \
	    > $(DESTDIR)$(PKGCONFIGDIR)/agentkv.pc
	chmod 644 $(DESTDIR)$(PKGCONFIGDIR)/agentkv.pc

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/agentkv $(DESTDIR)$(LIBDIR)/libagentkv.a $(DESTDIR)$(LIBDIR)/libagentkv.so \
	    $(DESTDIR)$(LIBDIR)/$(AK_SONAME) $(DESTDIR)$(LIBDIR)/libagentkv.so.$(AK_VERSION) \
	    $(DESTDIR)$(INCLUDEDIR)/agentkv.h $(DESTDIR)$(PKGCONFIGDIR)/agentkv.pc $(DESTDIR)$(MANDIR)/man1/agentkv.1

.PHONY: lib install uninstall
-include $(PIC_OBJ:.o=.d) $(PIC_DSP_RAW:.o=.d)
