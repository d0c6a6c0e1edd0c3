# tandem build. Outputs under $(BUILD). The ISA is chosen at run time, so the
# default build is portable: only cpu_experts/*_avx2.c and *_avx512.c get
# their target flags. CUDA code is compiled when nvcc exists.
#
#   make             library, CLI, tools, tests, benchmarks
#   make test        the whole CPU test suite (what CI runs)
#   make test-gpu    the GPU tests (needs a CUDA device)
#   make bench       the benchmarks (print tables, write JSON under bench/results)
#   make asan        sanitizer build (ASan + UBSan) and its test run
#   make fuzz        libFuzzer targets (clang), bounded runs
#   make clean

BUILD ?= build
CC ?= cc
OPT ?= -O2
SAN ?=
# Prefix of locally unpacked -dev packages (the GPU machine has no registry).
DEPS_PREFIX ?=
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# Consumer and datacentre cards from Turing to Blackwell, plus PTX for newer ones.
CUDA_ARCHS ?= 75 80 86 89 90 120
CUDA_PTX ?= 120
# nvcc compiles the architectures of one file in this many threads (the large
# kernel files dominate the build; 730 s instead of 818 s with make -j2 on 2 cores).
NVCC_THREADS ?= 2

DEPS_INC := $(if $(DEPS_PREFIX),-I$(DEPS_PREFIX)/usr/include -I$(DEPS_PREFIX)/usr/include/x86_64-linux-gnu)
comma := ,
DEPS_LIB := $(if $(DEPS_PREFIX),-L$(DEPS_PREFIX)/usr/lib/x86_64-linux-gnu -Wl$(comma)-rpath$(comma)$(abspath $(DEPS_PREFIX))/usr/lib/x86_64-linux-gnu)

INCLUDES := -Iengine -Icpu_experts -Igpu_experts -Iprofiles $(DEPS_INC)
CFLAGS := -std=c11 $(OPT) -g -Wall -Wextra -Wshadow -Wno-unused-parameter -Wno-missing-field-initializers \
          -fopenmp -D_GNU_SOURCE $(SAN) $(INCLUDES) -MMD -MP $(EXTRA_CFLAGS)
LDFLAGS := -fopenmp $(SAN) $(DEPS_LIB) $(EXTRA_LDFLAGS)
LDLIBS := -lhwloc -lnuma -lcjson -lmicrohttpd -lm -lpthread

AVX2_FLAGS := -mavx2 -mfma -mf16c
AVX512_FLAGS := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mfma -mf16c

CLI_SRC := $(wildcard engine/main.c engine/cli_*.c)
LIB_SRC := $(filter-out $(CLI_SRC),$(wildcard engine/*.c)) $(wildcard cpu_experts/*.c gpu_experts/*.c profiles/*.c)
CU_SRC := $(if $(NVCC),$(wildcard gpu_experts/*.cu))

ifneq ($(NVCC),)
CFLAGS += -DTDM_HAVE_CUDA
NVCC_GENCODE := $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
                -gencode arch=compute_$(CUDA_PTX),code=compute_$(CUDA_PTX)
NVCCFLAGS := -O3 -std=c++17 $(NVCC_GENCODE) --threads $(NVCC_THREADS) -Xcompiler -fPIC,-Wall $(INCLUDES) \
             -MMD -MP -DTDM_HAVE_CUDA $(EXTRA_NVCCFLAGS)
LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublas -lstdc++
endif

LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(CU_SRC:%.cu=$(BUILD)/obj/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/gen/cli_table.o
LIB := $(BUILD)/libtandem.a

TOOL_BIN := $(patsubst tools/%.c,$(BUILD)/tools/%,$(wildcard tools/*.c))
TEST_BIN := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(wildcard tests/unit/test_*.c))
GPU_TEST_BIN := $(if $(NVCC),$(patsubst tests/gpu/%.c,$(BUILD)/tests/gpu/%,$(wildcard tests/gpu/test_*.c)))
BENCH_BIN := $(patsubst bench/%.c,$(BUILD)/bench/%,$(wildcard bench/*.c))

.PHONY: all test test-gpu bench asan fuzz clean
all: $(BUILD)/tandem $(TOOL_BIN) $(TEST_BIN) $(GPU_TEST_BIN) $(BENCH_BIN)

$(BUILD)/obj/cpu_experts/%_avx2.o: cpu_experts/%_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX2_FLAGS) -c $< -o $@

$(BUILD)/obj/cpu_experts/%_avx512.o: cpu_experts/%_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX512_FLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# Each engine/cli_<name>.c defines `int tdm_cli_<name>(int argc, char **argv)`
# and `const char tdm_cli_<name>_help[]`; the command table is generated so that
# adding a command touches no shared file.
$(BUILD)/gen/cli_table.c: $(CLI_SRC) tools/gen_cli_table.sh
	@mkdir -p $(dir $@)
	tools/gen_cli_table.sh $(filter engine/cli_%.c,$(CLI_SRC)) > $@

$(BUILD)/obj/gen/cli_table.o: $(BUILD)/gen/cli_table.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/tandem: $(CLI_OBJ) $(LIB)
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(LIB) $(LDLIBS)

$(BUILD)/tools/%: $(BUILD)/obj/tools/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $< $(LIB) $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/unit/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $< $(LIB) -lcmocka $(LDLIBS)

$(BUILD)/tests/gpu/%: $(BUILD)/obj/tests/gpu/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $< $(LIB) -lcmocka $(LDLIBS)

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $< $(LIB) $(LDLIBS)

# Unit binaries, then the scripted suites (CLI parity, server + SDKs, UI).
test: all
	@BUILD=$(BUILD) tests/run.sh

test-gpu: all
	@BUILD=$(BUILD) tests/run.sh --gpu

bench: all
	@BUILD=$(BUILD) bench/run.sh

asan:
	$(MAKE) BUILD=build/asan OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" NVCC= all
	@BUILD=build/asan TDM_SANITIZER=1 tests/run.sh --unit

fuzz:
	@BUILD=$(BUILD) tests/fuzz/run.sh

# libFuzzer targets (tests/fuzz/run.sh): tests/fuzz/fuzz_NAME.c and the
# sources it tests, FUZZ_SRC_NAME, built by clang with the fuzzer and the
# sanitizers; whatever else they call is taken from $(LIB).
FUZZ_CC ?= clang
FUZZ_SRC_gguf := engine/gguf.c engine/gguf_writer.c engine/quant.c
FUZZ_SRC_request := engine/server_openai.c engine/server_anthropic.c engine/server_util.c engine/chat.c
FUZZ_SRC_tokenizer := engine/tokenizer.c engine/tokenizer_encode.c engine/tokenizer_decode.c engine/unicode.c
FUZZ_SRC_profile := profiles/profile.c
FUZZ_SRC_routing := profiles/routing.c profiles/cache_policy.c
$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(LIB)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -std=c11 -g -O1 -D_GNU_SOURCE -fno-omit-frame-pointer $(INCLUDES) \
	    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined $< $(FUZZ_SRC_$*) -o $@ \
	    $(DEPS_LIB) $(LIB) $(LDLIBS) -lgomp

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# Web chat page of `tandem serve` (engine/web/*), embedded into the library by
# tools/embed_web.sh as the generated $(BUILD)/gen/web_assets.c.
WEB_SRC := $(wildcard engine/web/*)
$(BUILD)/gen/web_assets.c: $(WEB_SRC) tools/embed_web.sh
	@mkdir -p $(dir $@)
	tools/embed_web.sh $(WEB_SRC) > $@

$(BUILD)/obj/gen/web_assets.o: $(BUILD)/gen/web_assets.c engine/server_internal.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(LIB): $(BUILD)/obj/gen/web_assets.o
