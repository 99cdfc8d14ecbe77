# agentkv - build, test, demo, benchmarks, fuzzing.
#   make            library + build/agentkv
#   make test       build and run every test (ends with "N passed, N failed, N skipped")
#   make demo       the main job (MODEL=path/to/model.gguf to override)
#   make asan       tests under AddressSanitizer + UndefinedBehaviorSanitizer
#   make fuzz       every libFuzzer target fuzz/fuzz_*.c, FUZZ_SECONDS each (FUZZ_TARGETS="gguf store"
#                   picks some, FUZZ_JOBS=2 runs two at a time)
#   make bench      engine benchmarks on synthetic 1B-shaped models
#   make bench-tools  the stand-alone measuring programs in bench/*.c, as BUILD/bench/NAME
#   make lib        the shared library and the installable archive; make install PREFIX=... DESTDIR=...,
#                   make uninstall (scripts/lib.mk, docs/library.md)
#   make soak       the server under mixed traffic for SOAK_SECONDS (bench/soak.py; fails on 5xx,
#                   RSS growth, leaked descriptors, a crash; plot and summary in BUILD/soak)
# ARCH=dispatch by default on x86-64: one binary with scalar, AVX2, AVX2+VNNI,
# AVX-512 and AVX-512+VNNI+VBMI kernels, the level picked at start from cpuid (AGENTKV_SIMD=...
# forces a lower one; see "Run-time dispatch" below and src/base/cpu.h). ARCH=native
# (the default elsewhere), ARCH=x86-64-v3 etc. build for that one target as
# before (SIMD chosen by the compiler's target); ARCH= for a portable scalar
# build, e.g. `make ARCH=x86-64 BUILD=build-scalar`.

# The dispatch rules below are evaluated before `all`: name the default goal.
.DEFAULT_GOAL := all

CC      ?= cc
BUILD   ?= build
ARCH    ?= $(if $(filter x86_64-%,$(shell $(CC) -dumpmachine)),dispatch,native)
OPT     ?= -O2
SAN     ?=
SHARED  ?= ../shared
MODEL   ?= $(SHARED)/models/stories260K.gguf
FUZZ_SECONDS ?= 60
FUZZ_JOBS ?= 1
SOAK_SECONDS ?= 60

DEPS_OK := $(shell sh scripts/deps.sh >&2 && echo ok)
ifneq ($(DEPS_OK),ok)
$(error missing build dependencies: run scripts/deps.sh as root)
endif

# Builds use every core unless the command line says otherwise (make -j1).
# Only the top-level make sets it: sub-makes share its job server.
ifeq ($(MAKELEVEL),0)
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 1)
endif

PCRE_CFLAGS := $(shell pkg-config --cflags libpcre2-8)
PCRE_LIBS   := $(shell pkg-config --libs libpcre2-8)
# A dispatched build compiles everything for the x86-64 baseline but the
# files with SIMD code (DSP_SRC below), which are compiled once per level.
DSP         := $(filter dispatch,$(ARCH))
ARCHFLAG    := $(if $(DSP),-march=x86-64,$(if $(ARCH),-march=$(ARCH),))
# GCC tunes some AVX-512 targets (Intel server cores) to prefer 256-bit
# vectors; the explicit 64-byte vectors of the attention and vmath code then
# meet 32-byte compiler-made halves (stack round trips). Where the compiler
# takes the flag (x86), loops it vectorizes use the full width too.
ARCHFLAG    += $(if $(DSP),,$(shell $(CC) $(ARCHFLAG) -mprefer-vector-width=512 -x c -c -o /dev/null /dev/null 2>/dev/null && echo -mprefer-vector-width=512))
CFLAGS  += -std=c11 $(OPT) -g $(ARCHFLAG) -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -pthread \
           -D_GNU_SOURCE -Isrc -Iinclude $(PCRE_CFLAGS) $(SAN) -MMD -MP
LDLIBS  += $(PCRE_LIBS) -lmicrohttpd -lcjson -lxxhash -lsodium -lhiredis -lm -pthread

LIB_SRC  := $(wildcard src/*/*.c)
CLI_SRC  := $(wildcard cli/*.c)
TEST_SRC := $(wildcard tests/*.c)
BENCH_SRC:= $(wildcard bench/*.c)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)

# ---- Run-time dispatch (ARCH=dispatch) ----
# DSP_SRC: the files whose code depends on the SIMD target (those including
# the kernels' or KV formats' internal headers, vmath.h or kquant.h: a new
# file with target-dependent code must include one of them). Each is
# compiled once per level into $(BUILD)/dsp/LEVEL/raw/, its global symbols
# renamed NAME__LEVEL (scripts/dispatch.sh map, objcopy), and every function
# reached through a generated jump (scripts/dispatch.sh stubs) whose table
# src/base/cpu.c fills once per process. Data of the scalar copy keeps its name.
# A level's flags are the instruction sets src/base/cpu.c checks for it.
# In ak_cpu_level_id's order (src/base/cpu.h, scripts/dispatch.sh's LEVELS).
DSP_LEVELS         := scalar avx2 avx2vnni avx512 avx512vnni
DSP_FLAGS_scalar   := -march=x86-64
DSP_FLAGS_avx2     := -march=x86-64-v3
DSP_FLAGS_avx2vnni := -march=x86-64-v3 -mavxvnni
DSP_FLAGS_avx512   := -march=x86-64-v4 -mprefer-vector-width=512
DSP_FLAGS_avx512vnni := -march=x86-64-v4 -mavx512vnni -mavx512vbmi -mprefer-vector-width=512
OBJCOPY  ?= objcopy
ifneq ($(DSP),)
DSP_SRC  := $(filter-out %_arm.c,$(shell grep -l -E '^\#include "[a-z]+/(kernels_backend|kernels_impl|kvformat_impl|vmath|kquant|kvformat_quant)\.h"' $(LIB_SRC)))
DSP_RAW  := $(foreach L,$(DSP_LEVELS),$(DSP_SRC:%.c=$(BUILD)/dsp/$(L)/raw/%.o))
LIB_OBJ  := $(filter-out $(DSP_SRC:%.c=$(BUILD)/%.o),$(LIB_OBJ)) \
            $(foreach L,$(DSP_LEVELS),$(DSP_SRC:%.c=$(BUILD)/dsp/$(L)/%.o)) $(BUILD)/dsp/stubs.o
$(BUILD)/src/base/cpu.o: CFLAGS += -DAK_DISPATCH

# The rules of level $(1) under directory $(2) (the build's, or the shared
# library's PIC copy: scripts/lib.mk), compiled with $(3) too; then the
# stubs of directory $(1).
define DSP_LEVEL_RULES
$(2)/dsp/$(1)/raw/%.o: %.c
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) $$(DSP_FLAGS_$(1)) $(3) -c $$< -o $$@
$(2)/dsp/$(1).map: $$(DSP_SRC:%.c=$(2)/dsp/$(1)/raw/%.o) scripts/dispatch.sh
	sh scripts/dispatch.sh map $(1) $$@ $$(DSP_SRC:%.c=$(2)/dsp/$(1)/raw/%.o)
$(2)/dsp/$(1)/%.o: $(2)/dsp/$(1)/raw/%.o $(2)/dsp/$(1).map
	@mkdir -p $$(dir $$@)
	$$(OBJCOPY) --redefine-syms=$(2)/dsp/$(1).map $$< $$@
endef
define DSP_STUB_RULES
$(1)/dsp/stubs.s: $$(DSP_LEVELS:%=$(1)/dsp/%.map) scripts/dispatch.sh
	sh scripts/dispatch.sh stubs $$@ $(1)/dsp
$(1)/dsp/stubs.o: $(1)/dsp/stubs.s
	$$(CC) -c $$< -o $$@
endef
$(foreach L,$(DSP_LEVELS),$(eval $(call DSP_LEVEL_RULES,$(L),$(BUILD),)))
$(eval $(call DSP_STUB_RULES,$(BUILD)))
endif

# The console (GET /): the files of src/serve/console/ become C arrays in
# $(BUILD)/gen/console_assets.c (scripts/embed.sh: od and sed, no network),
# compiled into the library (src/serve/console.h).
CONSOLE_FILES := $(sort $(wildcard src/serve/console/*))
CONSOLE_C     := $(BUILD)/gen/console_assets.c
LIB_OBJ       += $(BUILD)/gen/console_assets.o
$(CONSOLE_C): $(CONSOLE_FILES) scripts/embed.sh
	@mkdir -p $(dir $@)
	sh scripts/embed.sh $@ $(CONSOLE_FILES)
$(BUILD)/gen/console_assets.o: $(CONSOLE_C)
	$(CC) $(CFLAGS) -c $< -o $@

all: $(BUILD)/agentkv $(BUILD)/agentkv-tests

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# Attention's vector loops (GNU C vectors, no intrinsics) need a*b+c fused:
# ISO C mode (-std=c11) turns contraction off, which halves their speed.
# Only here: quantizers and the scalar references stay unfused, so stored
# bytes are the same on machines with and without FMA.
$(BUILD)/src/kv/kvcache.o $(DSP_LEVELS:%=$(BUILD)/dsp/%/raw/src/kv/kvcache.o): CFLAGS += -ffp-contract=fast

$(BUILD)/libagentkv.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/agentkv: $(CLI_OBJ) $(BUILD)/libagentkv.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# The store's fault injection (AK_FAULT_*) exists only in the test binary:
# a second object of the directory backend (store_dir.c), linked ahead of
# the library (whose store_dir.o then goes unused), so the shipped agentkv
# has none.
$(BUILD)/src/store_fault.o: src/store/store_dir.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DAK_FAULT_INJECTION -c $< -o $@

$(BUILD)/agentkv-tests: $(TEST_OBJ) $(BUILD)/src/store_fault.o $(BUILD)/libagentkv.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# The installable library, make install and uninstall (scripts/lib.mk).
include scripts/lib.mk

# A dispatched build first runs the SIMD-dependent tests at each lower level
# the CPU supports (scripts/test-levels.sh; not with T=..., nor LEVEL_TESTS=0),
# then every test at the level chosen.
# The tests run in TEST_JOBS processes (tests/main.c, AK_TEST_JOBS), output
# still whole and in name order.
LEVEL_TESTS ?= 1
TEST_JOBS ?= $(shell nproc 2>/dev/null || echo 1)
# The library tests (test_lib.c) read the shared library beside AK_BIN and
# run `$(AK_MAKE) install` into a temporary DESTDIR (this make's variables
# passed on), building examples/embed.c with AK_EMBED_CFLAGS (the sanitizers).
# A sanitized build (make asan) leaves the shared library out (ASAN_EXCLUDE).
test: check-layers $(BUILD)/agentkv-tests $(BUILD)/agentkv $(if $(SAN),,lib $(AK_MAN))
	$(if $(DSP),$(if $(T),,$(if $(filter 1,$(LEVEL_TESTS)),AK_TEST_JOBS=$(TEST_JOBS) AK_SHARED=$(SHARED) AK_BIN=$(BUILD)/agentkv sh scripts/test-levels.sh $(BUILD))))
	AK_TEST_JOBS=$(TEST_JOBS) AK_SHARED=$(SHARED) AK_BIN=$(BUILD)/agentkv AK_MAKE="$(MAKE)" AK_EMBED_CFLAGS="$(SAN)" \
	    $(BUILD)/agentkv-tests $(T)

# The console's tests alone (test_console.c, test_server_hard.c's
# server_console_*; the browser test drives headless chromium).
# CONSOLE_SHOT=docs/console.png also writes the browser test's screenshot there.
test-ui: $(BUILD)/agentkv-tests $(BUILD)/agentkv
	AK_SHARED=$(SHARED) AK_BIN=$(BUILD)/agentkv AK_CONSOLE_SHOT=$(CONSOLE_SHOT) $(BUILD)/agentkv-tests console

demo: $(BUILD)/agentkv
	python3 scripts/demo.py $(BUILD)/agentkv $(MODEL)

# The sanitizer run leaves out the two long perplexity tests (512 and 1024
# tokens: half its time under ASan); their code runs there in the 128-token
# ones, and they run in every plain `make test`. It leaves out the shared
# library's export and install tests too (a sanitized build does not make
# the PIC copy they read: it would compile the library a second time); the
# public API's own tests (test_lib.c) run under the sanitizers.
ASAN_EXCLUDE ?= golden_ppl_tiny_llama_c512,golden_ppl_tiny_llama_c1024,lib_exports_only_the_header,lib_install_embed_warm_restart
asan:
	AK_TESTS_EXCLUDE=$(ASAN_EXCLUDE) $(MAKE) BUILD=build-asan ARCH=$(if $(DSP),native,$(ARCH)) OPT=-O1 SAN="-fsanitize=address,undefined,float-cast-overflow -fno-omit-frame-pointer -fno-sanitize-recover=undefined" test

# Fuzzing: every fuzz/fuzz_NAME.c is a libFuzzer target linked against the
# whole library, built with clang under ASan + UBSan (fuzz/run.sh runs them;
# seeds in fuzz/corpus/NAME/, working corpus in $(BUILD)/fuzz/NAME/, logs and
# failing inputs in $(BUILD)/fuzz/). The library objects are compiled once
# for every target. Targets that need a model read AK_FUZZ_MODEL.
FUZZ_SRC     := $(wildcard fuzz/fuzz_*.c)
FUZZ_ALL     := $(FUZZ_SRC:fuzz/fuzz_%.c=%)
FUZZ_TARGETS ?= $(FUZZ_ALL)
FUZZ_CC      ?= clang
FUZZ_DIR     := $(BUILD)/fuzz
FUZZ_SAN     := -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=undefined,float-cast-overflow
FUZZ_CFLAGS  := -std=c11 -O1 -g -fno-omit-frame-pointer $(if $(DSP),-march=native,$(ARCHFLAG)) -Wall -Wextra -Wno-unused-parameter \
                -Wno-missing-field-initializers -pthread -D_GNU_SOURCE -Isrc -Iinclude $(PCRE_CFLAGS) -MMD -MP
FUZZ_LIB_OBJ := $(LIB_SRC:%.c=$(FUZZ_DIR)/obj/%.o) $(FUZZ_DIR)/obj/gen/console_assets.o
AK_FUZZ_MODEL ?= $(SHARED)/models/stories260K.gguf
# The SIMD kernels get UBSan's arithmetic checks only: on their intrinsics
# clang's full ASan + UBSan take minutes per file (kernels_packed.c: 6 s
# plain, 12 s these checks, 30 s ASan, 60 s UBSan, 3 min both; with
# pointer-overflow too, kvformat_x86.c took over 2 min). Their memory
# accesses are `make asan`'s to check.
FUZZ_SIMD_SRC := $(wildcard src/*/*_x86.c src/*/*_arm.c src/*/kernels_packed*.c)
$(FUZZ_SIMD_SRC:%.c=$(FUZZ_DIR)/obj/%.o): FUZZ_SAN := \
    -fsanitize=signed-integer-overflow,shift,integer-divide-by-zero,float-cast-overflow,bounds,vla-bound \
    -fno-sanitize-recover=all

$(FUZZ_DIR)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_SAN) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_DIR)/obj/gen/console_assets.o: $(CONSOLE_C)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@

$(FUZZ_DIR)/fuzz_%: $(FUZZ_DIR)/obj/fuzz/fuzz_%.o $(FUZZ_LIB_OBJ)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_SAN) -fsanitize=fuzzer -o $@ $^ $(LDLIBS)

fuzz-build: $(FUZZ_TARGETS:%=$(FUZZ_DIR)/fuzz_%)

.PRECIOUS: $(FUZZ_DIR)/obj/%.o

fuzz: fuzz-build
	AK_SHARED=$(SHARED) AK_FUZZ_MODEL=$(AK_FUZZ_MODEL) FUZZ_JOBS=$(FUZZ_JOBS) sh fuzz/run.sh $(FUZZ_DIR) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

bench: $(BUILD)/agentkv
	sh bench/engine.sh $(BUILD)/agentkv
	BENCH_DIR=$(BUILD)/bench-models OUT=$(BUILD)/bench-cards SHARED=$(SHARED) sh bench/cards.sh $(BUILD)/agentkv

# Stand-alone measuring programs in bench/*.c, linked against the library:
# `make bench-tools` builds $(BUILD)/bench/NAME for each (e.g. attnstats_cost).
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
$(BUILD)/bench/%: bench/%.c $(BUILD)/libagentkv.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)
bench-tools: $(BENCH_BIN)

soak: $(BUILD)/agentkv
	python3 bench/soak.py --bin $(BUILD)/agentkv --model $(SHARED)/models/stories260K.gguf \
	    --seconds $(SOAK_SECONDS) --out $(BUILD)/soak

clean:
	rm -rf build build-asan build-scalar build-arm

# The layer rule of src/ (scripts/check-layers.sh: which folder may include
# which, and the README's copy of the table).
check-layers:
	sh scripts/check-layers.sh src README.md

.PHONY: all test test-ui check-layers demo asan fuzz fuzz-build bench bench-tools soak clean
-include $(LIB_OBJ:.o=.d) $(DSP_RAW:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(BUILD)/src/store_fault.d
-include $(wildcard $(FUZZ_DIR)/obj/*/*.d)

# ---- AArch64: cross build, tests under qemu-aarch64 (make test-arm) ----
# The kernel, weight-type, KV-format and golden tests, built by Debian's
# cross compiler for the AArch64 baseline (armv8-a: the dotprod and i8mm
# kernels are picked at run time) and run under qemu-aarch64 with two CPU
# models, "max" (dotprod + i8mm) and "cortex-a53" (plain NEON); see
# scripts/test-arm.sh (AK_ARM_CPUS, AK_ARM_TESTS choose others). Its
# packages (cross gcc, qemu-user, arm64 libraries): scripts/deps-cross.sh,
# run by this target only. Ends with "N passed, N failed, N skipped".
ARM_BUILD ?= build-arm
ARM_CC    ?= aarch64-linux-gnu-gcc
test-arm:
	sh scripts/deps-cross.sh
	$(MAKE) CC=$(ARM_CC) ARCH=armv8-a BUILD=$(ARM_BUILD) AK_CROSS_ARM=1 $(ARM_BUILD)/agentkv-tests
	sh scripts/test-arm.sh $(ARM_BUILD)/agentkv-tests $(SHARED)
# GCC 12's AArch64 vectorizer stops with an internal compiler error on some
# test files (test_kquant.c, test_kvcache.c: vect_transform_reduction): the
# tests are built without it (the library keeps it).
ifneq ($(AK_CROSS_ARM),)
$(TEST_OBJ): CFLAGS += -fno-tree-vectorize
endif
.PHONY: test-arm
