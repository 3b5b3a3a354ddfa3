# lucid — build, test and run.
#
#   make            engine library, Lua module lucid.so, host program bin/lucid
#   make deps       install the Debian packages the build and tests need (idempotent)
#   make test       C unit tests, source lints (spec/c/test_*.sh) + busted specs on the CPU;
#                   ends with "N passed, N failed"
#   make test-gpu   the same plus the specs tagged gpu (on a machine with a GPU)
#   make run        install, build and run the main job recipes/pose_nano.lua
#   make bench      benchmarks (GPU machine)
#   make bench-fit  the complete-fit table, eager vs recorded in alternating
#                   fresh-process pairs (bench/fit_pairs.lua; GPU machine);
#                   FIT="pairs=5 budget_s=0 write=docs/BENCH.md" passes knobs
#   make gpu-pack   pack LuaJIT+busted (.runtime/) and the mini dataset (.data/) to carry
#
# Knobs: CUDA=0|1 (default: 1 when nvcc is found), ARCH=sm_90, DEBUG=1, CUDNN_HOME=dir

SHELL := /bin/bash
CC ?= gcc
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME ?= $(if $(NVCC),$(patsubst %/bin/nvcc,%,$(NVCC)),/usr/local/cuda)
CUDA ?= $(if $(NVCC),1,0)
ARCH ?= sm_90
DEBUG ?= 0

# cuDNN: the toolkit's own, /usr/include, or the one inside PyTorch's venv.
CUDNN_HOME ?= $(shell \
  if [ -f $(CUDA_HOME)/include/cudnn.h ]; then echo $(CUDA_HOME); \
  elif [ -f /usr/include/cudnn.h ] || [ -f /usr/include/x86_64-linux-gnu/cudnn.h ]; then echo /usr; \
  else python3 -c 'import nvidia.cudnn,os;print(os.path.dirname(nvidia.cudnn.__file__))' 2>/dev/null; fi)

LUA_CFLAGS := $(shell pkg-config --cflags luajit 2>/dev/null || echo -I/usr/include/luajit-2.1)
LUA_LIBS := $(shell pkg-config --libs luajit 2>/dev/null || echo -lluajit-5.1)

# A packed runtime (make gpu-pack) supplies headers and libraries on machines
# that lack the Debian packages (the GPU machine).
RUNTIME := $(wildcard $(CURDIR)/.runtime/include)
ifneq ($(RUNTIME),)
  RT := $(CURDIR)/.runtime
  LUA_CFLAGS := -I$(RT)/include/luajit-2.1
  LUA_LIBS := -L$(RT)/lib -Wl,-rpath,$(RT)/lib -lluajit-5.1
  RT_CFLAGS := -I$(RT)/include
  RT_LIBS := -L$(RT)/lib -Wl,-rpath,$(RT)/lib
endif

OPT := $(if $(filter 1,$(DEBUG)),-O0 -g3,-O2 -g)
CFLAGS_COMMON := $(OPT) -fPIC -Wall -Wextra -Wno-unused-parameter -D_GNU_SOURCE -pthread -Iengine -MMD -MP $(RT_CFLAGS)
CFLAGS := -std=c11 $(CFLAGS_COMMON)
LIBS := $(RT_LIBS) -lopenblas -lpng -ljpeg -lyaml -lcjson -lz -lm -lpthread -ldl

ENGINE_SRC := $(filter-out engine/core/cuda_absent.c,$(shell find engine -name '*.c' | sort))
CUDA_SRC := $(sort $(wildcard cuda/*.cu))
LUA_SRC := $(sort $(wildcard lua/*.c))
CTEST_SRC := $(sort $(wildcard spec/c/test_*.c))

ENGINE_OBJ := $(ENGINE_SRC:%.c=build/%.o)
LUA_OBJ := $(LUA_SRC:%.c=build/%.o)
CTEST_BIN := $(CTEST_SRC:spec/c/%.c=build/tests/%)
# host-side checks of CUDA kernels' index maps (nvcc, no GPU needed)
CUTEST_SRC := $(sort $(wildcard spec/c/test_*.cu))
# source lints (scripts; installed as build/tests/test_* and counted the same way)
CTEST_SH := $(sort $(wildcard spec/c/test_*.sh))
CTEST_BIN += $(CTEST_SH:spec/c/%.sh=build/tests/%)

ifeq ($(CUDA),1)
  CUDA_OBJ := $(CUDA_SRC:%.cu=build/%.o)
  CTEST_BIN += $(CUTEST_SRC:spec/c/%.cu=build/tests/%)
  NVCCFLAGS := -std=c++17 -O2 -g -lineinfo -arch=$(ARCH) -Xcompiler -fPIC,-Wall -Iengine -MMD -MP
  CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublas -lcublasLt -lstdc++
  ifneq ($(CUDNN_HOME),)
    NVCCFLAGS += -I$(CUDNN_HOME)/include -DLUCID_HAVE_CUDNN=1
    CUDA_LIBS += -L$(CUDNN_HOME)/lib -L$(CUDNN_HOME)/lib64 -Wl,-rpath,$(CUDNN_HOME)/lib -Wl,-rpath,$(CUDNN_HOME)/lib64 -lcudnn
  endif
else
  CUDA_OBJ := build/engine/core/cuda_absent.o
  CUDA_LIBS :=
endif

ALL_LIBS := $(CUDA_LIBS) $(LIBS)
LIB := build/libengine.a

.PHONY: all deps test test-gpu run bench bench-fit gpu-pack clean info print-link-flags print-cuda
all: info $(LIB) lucid.so bin/lucid build/examples/host_example

info:
	@echo "lucid build: CUDA=$(CUDA) $(if $(filter 1,$(CUDA)),(✓ nvcc $(NVCC), -arch=$(ARCH)),(✗ nvcc: CPU-only build))" \
	      "$(if $(CUDNN_HOME),✓ cuDNN $(CUDNN_HOME),✗ cuDNN)" "LuaJIT: $(LUA_CFLAGS)"

build/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(if $(filter lua/%,$<),$(LUA_CFLAGS) -Ilua,) -c $< -o $@

build/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# The archive is rebuilt whenever the CUDA setting changes.
CONFIG_STAMP := build/.config-cuda$(CUDA)
$(CONFIG_STAMP):
	@mkdir -p build && rm -f build/.config-cuda* && touch $@

$(LIB): $(ENGINE_OBJ) $(CUDA_OBJ) $(CONFIG_STAMP)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $(filter %.o,$^)

lucid.so: $(LUA_OBJ) $(LIB)
	$(CC) -shared -o $@ $(LUA_OBJ) -Wl,--whole-archive $(LIB) -Wl,--no-whole-archive $(ALL_LIBS)

bin/lucid: lua/host/main.c $(LUA_OBJ) $(LIB)
	@mkdir -p bin
	$(CC) $(CFLAGS) $(LUA_CFLAGS) -Ilua -o $@ $< $(LUA_OBJ) $(LIB) $(LUA_LIBS) $(ALL_LIBS) -rdynamic

build/examples/host_example: examples/host_example.c $(LUA_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LUA_CFLAGS) -Ilua -o $@ $< $(LUA_OBJ) $(LIB) $(LUA_LIBS) $(ALL_LIBS)

build/tests/%: spec/c/%.c $(LIB) spec/c/test.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Ispec/c -o $@ $< $(LIB) $(ALL_LIBS)

build/tests/%: spec/c/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Icuda -o $@ $<

build/tests/%: spec/c/%.sh
	@mkdir -p $(dir $@)
	install -m 755 $< $@

test: all $(CTEST_BIN)
	@spec/run_tests.sh cpu

test-gpu: all $(CTEST_BIN)
	@spec/run_tests.sh gpu

run: deps all
	luajit recipes/pose_nano.lua

bench: all
	@bench/run.sh

# one benchmark program, built as bench/run.sh builds it (e.g.
# make build/bench/bench_conv_small_cuda)
build/bench/%: bench/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) -O2 -std=c11 -D_GNU_SOURCE -Iengine $(RT_CFLAGS) $(if $(filter 1,$(CUDA)),-I$(CUDA_HOME)/include,) -o $@ $< $(LIB) $(ALL_LIBS)

FIT ?=
bench-fit: all
	luajit bench/fit_pairs.lua $(FIT)

DEB_PACKAGES := build-essential pkg-config luajit libluajit-5.1-dev lua-busted lua-cjson \
  libpng-dev libjpeg62-turbo-dev libopenblas-dev libyaml-dev libcjson-dev zlib1g-dev python3
deps:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing: $$missing"; \
	  SUDO=$$( [ $$(id -u) -eq 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	else echo "deps: all Debian packages present"; fi

gpu-pack:
	tools/gpu-pack.sh

print-link-flags:
	@echo $(RT_CFLAGS) $(if $(filter 1,$(CUDA)),-I$(CUDA_HOME)/include,) $(ALL_LIBS)

print-cuda:
	@echo $(CUDA)

clean:
	rm -rf build bin lucid.so

-include $(shell find build -name '*.d' 2>/dev/null)
