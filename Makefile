# agentkv - build, test, demo, benchmarks, fuzzing.
#   make            library + build/agentkv
#   make test       build and run every test (ends with "N passed, N failed")
#   make demo       the main job (MODEL=path/to/model.gguf to override)
#   make asan       tests under AddressSanitizer + UndefinedBehaviorSanitizer
#   make fuzz       libFuzzer on the GGUF reader and the agent-file reader, bounded time (FUZZ_SECONDS each)
#   make bench      engine benchmarks on synthetic 1B-shaped models
# ARCH=native by default (SIMD chosen by the compiler's target); ARCH= for a
# portable scalar build, e.g. `make ARCH=x86-64 BUILD=build-scalar`.

CC      ?= cc
BUILD   ?= build
ARCH    ?= native
OPT     ?= -O2
SAN     ?=
SHARED  ?= ../shared
MODEL   ?= $(SHARED)/models/stories260K.gguf
FUZZ_SECONDS ?= 60

DEPS_OK := $(shell sh scripts/deps.sh >&2 && echo ok)
ifneq ($(DEPS_OK),ok)
$(error missing build dependencies: run scripts/deps.sh as root)
endif

PCRE_CFLAGS := $(shell pkg-config --cflags libpcre2-8)
PCRE_LIBS   := $(shell pkg-config --libs libpcre2-8)
ARCHFLAG    := $(if $(ARCH),-march=$(ARCH),)
# GCC tunes some AVX-512 targets (Intel server cores) to prefer 256-bit
# vectors; the explicit 64-byte vectors of the attention and vmath code then
# meet 32-byte compiler-made halves (stack round trips). Where the compiler
# takes the flag (x86), loops it vectorizes use the full width too.
ARCHFLAG    += $(shell $(CC) $(ARCHFLAG) -mprefer-vector-width=512 -x c -c -o /dev/null /dev/null 2>/dev/null && echo -mprefer-vector-width=512)
CFLAGS  += -std=c11 $(OPT) -g $(ARCHFLAG) -Wall -Wextra -Wno-unused-parameter -pthread \
           -D_GNU_SOURCE $(PCRE_CFLAGS) $(SAN) -MMD -MP
LDLIBS  += $(PCRE_LIBS) -lmicrohttpd -lcjson -lxxhash -lsodium -lm -pthread

LIB_SRC  := $(wildcard src/*.c)
CLI_SRC  := $(wildcard cli/*.c)
TEST_SRC := $(wildcard tests/*.c)
BENCH_SRC:= $(wildcard bench/*.c)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)

all: $(BUILD)/agentkv $(BUILD)/agentkv-tests

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# Attention's vector loops (GNU C vectors, no intrinsics) need a*b+c fused:
# ISO C mode (-std=c11) turns contraction off, which halves their speed.
# Only here: quantizers and the scalar references stay unfused, so stored
# bytes are the same on machines with and without FMA.
$(BUILD)/src/kvcache.o: CFLAGS += -ffp-contract=fast

$(BUILD)/libagentkv.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/agentkv: $(CLI_OBJ) $(BUILD)/libagentkv.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/agentkv-tests: $(TEST_OBJ) $(BUILD)/libagentkv.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

test: $(BUILD)/agentkv-tests $(BUILD)/agentkv
	AK_SHARED=$(SHARED) AK_BIN=$(BUILD)/agentkv $(BUILD)/agentkv-tests $(T)

demo: $(BUILD)/agentkv
	python3 scripts/demo.py $(BUILD)/agentkv $(MODEL)

asan:
	$(MAKE) BUILD=build-asan OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" test

fuzz:
	@mkdir -p $(BUILD)/fuzz/corpus $(BUILD)/fuzz/store-corpus
	clang -std=c11 -O1 -g -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined $(PCRE_CFLAGS) \
	    fuzz/fuzz_gguf.c src/gguf.c src/util.c -o $(BUILD)/fuzz/fuzz_gguf -lm
	clang -std=c11 -O1 -g -D_GNU_SOURCE $(ARCHFLAG) -fsanitize=fuzzer,address,undefined $(PCRE_CFLAGS) \
	    fuzz/fuzz_store.c $(LIB_SRC) -o $(BUILD)/fuzz/fuzz_store $(LDLIBS)
	@# the logs are kept whole; each fuzzer's exit status (not tail's) is make's
	$(BUILD)/fuzz/fuzz_gguf -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -artifact_prefix=$(BUILD)/fuzz/ \
	    $(BUILD)/fuzz/corpus fuzz/seeds > $(BUILD)/fuzz/log 2>&1; rc=$$?; tail -5 $(BUILD)/fuzz/log; exit $$rc
	$(BUILD)/fuzz/fuzz_store -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -artifact_prefix=$(BUILD)/fuzz/ \
	    $(BUILD)/fuzz/store-corpus fuzz/store-seeds > $(BUILD)/fuzz/store-log 2>&1; rc=$$?; tail -5 $(BUILD)/fuzz/store-log; exit $$rc

bench: $(BUILD)/agentkv
	sh bench/engine.sh $(BUILD)/agentkv

clean:
	rm -rf build build-asan build-scalar

.PHONY: all test demo asan fuzz bench clean
-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_OBJ:.o=.d)
