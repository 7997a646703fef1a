# vramplan: GPU memory planner for deep-learning training.
#
#   make                  libvramplan.a and ./vramplan
#   make run              check dependencies, build, estimate GPT-2 small
#   make test             check dependencies, build and run the tests
#   make test SANITIZE=address,undefined
#                         the same, built with sanitizers under build/san-*
#   make deps             check (and as root, install) the Debian packages
#   make install          PREFIX=/usr/local, DESTDIR for staging
#   make calibrate        the CUDA calibration programs, when nvcc is found
#   make accuracy         compare with the measured ground truth
#   make equiv            this tree's output against EQUIV_BASE's (default
#                         main), byte for byte (scripts/equiv.sh)
#   make clean
#
# Variables: CC, CFLAGS (default -O2 -g), LDFLAGS, PREFIX, DESTDIR,
# PKG_CONFIG, NVCC, SANITIZE (comma list of address, undefined, leak,
# thread; SANITIZER is accepted too), V=1 for the full commands.

CC ?= cc
AR ?= ar
CFLAGS ?= -O2 -g
LDFLAGS ?=
PREFIX ?= /usr/local
PKG_CONFIG ?= pkg-config
NVCC ?= $(shell command -v nvcc 2>/dev/null)
include replay/replay.mk
NVCCFLAGS ?= -O2
SANITIZE ?= $(SANITIZER)

# Debian packages the build and the tests need, as package:pkg-config-module
# (empty module: the package provides the pkg-config program itself).
DEB_PACKAGES := pkg-config: libyaml-dev:yaml-0.1 libgsl-dev:gsl \
                libcriterion-dev:criterion

comma := ,
SANITIZERS := address undefined leak thread

ifneq ($(strip $(SANITIZE)),)
  unknown_san := $(filter-out $(SANITIZERS),$(subst $(comma), ,$(SANITIZE)))
  ifneq ($(unknown_san),)
    $(error SANITIZE: unknown sanitizer '$(unknown_san)' (expected a comma-separated list of: $(SANITIZERS)))
  endif
  # Sanitized builds live apart, so their objects never mix with normal ones.
  BUILD := build/san-$(subst $(comma),-,$(SANITIZE))
  BIN := $(BUILD)/vramplan
  LIB := $(BUILD)/libvramplan.a
  SAN_FLAGS := -fsanitize=$(SANITIZE) -fno-omit-frame-pointer \
               -fno-sanitize-recover=all
  TEST_ENV := ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
              UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
else
  BUILD := build
  BIN := vramplan
  LIB := libvramplan.a
  SAN_FLAGS :=
  TEST_ENV :=
endif

# Read once per make run; `test` and `run` re-enter make after `deps`, so
# packages that `deps` just installed are seen.
PKG_CFLAGS := $(shell $(PKG_CONFIG) --cflags yaml-0.1 gsl 2>/dev/null)
PKG_LIBS := $(shell $(PKG_CONFIG) --libs yaml-0.1 gsl 2>/dev/null || \
                    echo -lyaml -lgsl -lgslcblas)
CRITERION_CFLAGS := $(shell $(PKG_CONFIG) --cflags criterion 2>/dev/null)
CRITERION_LIBS := $(shell $(PKG_CONFIG) --libs criterion 2>/dev/null || \
                          echo -lcriterion)

VP_CFLAGS = -std=c11 -Wall -Wextra -Wpedantic -Wshadow -Wstrict-prototypes \
            -Iinclude $(PKG_CFLAGS) $(SAN_FLAGS)
VP_LDFLAGS = $(SAN_FLAGS)
VP_LIBS = $(PKG_LIBS) -lm

LIB_SRCS := $(wildcard src/*.c src/ops/*.c)
CLI_SRCS := $(wildcard src/cli/*.c)
TEST_SRCS := $(wildcard tests/test_*.c)
CU_SRCS := $(wildcard calibrate/*.cu)
HEADERS := $(wildcard include/vramplan/*.h)

LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/%.o)
CLI_OBJS := $(CLI_SRCS:%.c=$(BUILD)/%.o)
TEST_OBJS := $(TEST_SRCS:%.c=$(BUILD)/%.o)
TEST_BINS := $(TEST_OBJS:%.o=%)
CU_BINS := $(CU_SRCS:calibrate/%.cu=build/calibrate/%)

ifndef V
  QUIET_CC = @printf '    %-4s %s\n' CC $@;
  QUIET_AR = @printf '    %-4s %s\n' AR $@;
  QUIET_LINK = @printf '    %-4s %s\n' LINK $@;
endif

.DEFAULT_GOAL := all
.DELETE_ON_ERROR:
.PHONY: all deps run test check clean install uninstall calibrate accuracy \
        equiv

all: $(LIB) $(BIN)

$(BUILD)/%.o: %.c
	@mkdir -p $(@D)
	$(QUIET_CC)$(CC) $(VP_CFLAGS) $(EXTRA_CFLAGS) $(CFLAGS) -MMD -MP \
	    -c $< -o $@

$(TEST_OBJS): EXTRA_CFLAGS = $(CRITERION_CFLAGS)

$(LIB): $(LIB_OBJS)
	@mkdir -p $(@D)
	@rm -f $@
	$(QUIET_AR)$(AR) rcs $@ $^

$(BIN): $(CLI_OBJS) $(LIB)
	$(QUIET_LINK)$(CC) $(VP_LDFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ \
	    $(CLI_OBJS) $(LIB) $(VP_LIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(LIB)
	$(QUIET_LINK)$(CC) $(VP_LDFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< \
	    $(LIB) $(CRITERION_LIBS) $(VP_LIBS)

-include $(LIB_OBJS:.o=.d) $(CLI_OBJS:.o=.d) $(TEST_OBJS:.o=.d)

# A package counts as present when dpkg has it installed or, elsewhere,
# when pkg-config finds its module.
deps:
	@missing=""; \
	command -v $(CC) >/dev/null 2>&1 || missing=" gcc libc6-dev"; \
	for entry in $(DEB_PACKAGES); do \
	    pkg=$${entry%%:*}; mod=$${entry#*:}; \
	    dpkg-query -W -f='$${Status}\n' $$pkg 2>/dev/null | \
	        grep -q ' installed$$' && continue; \
	    if [ -z "$$mod" ]; then \
	        command -v $(PKG_CONFIG) >/dev/null 2>&1 && continue; \
	    else \
	        $(PKG_CONFIG) --exists $$mod 2>/dev/null && continue; \
	    fi; \
	    missing="$$missing $$pkg"; \
	done; \
	[ -z "$$missing" ] && exit 0; \
	if ! command -v apt-get >/dev/null 2>&1; then \
	    echo "deps: missing:$$missing; install them with your package manager" >&2; \
	    exit 1; \
	fi; \
	if [ "$$(id -u)" != 0 ]; then \
	    echo "deps: missing:$$missing" >&2; \
	    echo "deps: run: sudo apt-get update && sudo apt-get install -y$$missing" >&2; \
	    exit 1; \
	fi; \
	echo "deps: installing$$missing"; \
	apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y$$missing

run: deps
	@$(MAKE) --no-print-directory all
	./$(BIN) estimate models/gpt2-small.yaml --batch 8 --seq 1024 \
	    --precision amp-bf16

# Runs every test binary from the repository root and adds up Criterion's
# "Synthesis: Tested: X | Passing: Y | Failing: Z | Crashing: W" lines
# (Failing includes Crashing). A binary that exits non-zero with no failed
# test (a sanitizer report at exit, a Criterion warning) or prints no
# synthesis counts as one failure.
test: deps
	@$(MAKE) --no-print-directory all $(TEST_BINS)
	@passed=0; failed=0; \
	for t in $(TEST_BINS); do \
	    printf '    %-4s %s\n' TEST "$$t"; \
	    out=$$(VRAMPLAN_BIN=./$(BIN) $(TEST_ENV) ./$$t 2>&1); rc=$$?; \
	    printf '%s\n' "$$out"; \
	    line=$$(printf '%s\n' "$$out" | grep 'Synthesis: Tested:' | tail -n 1); \
	    p=$$(printf '%s' "$$line" | sed -n 's/.*Passing: *\([0-9]*\).*/\1/p'); \
	    f=$$(printf '%s' "$$line" | sed -n 's/.*Failing: *\([0-9]*\).*/\1/p'); \
	    if [ -z "$$p" ] || [ -z "$$f" ]; then \
	        echo "$$t: no Criterion synthesis (exit status $$rc)"; \
	        failed=$$((failed + 1)); continue; \
	    fi; \
	    passed=$$((passed + p)); failed=$$((failed + f)); \
	    if [ $$rc -ne 0 ] && [ $$f -eq 0 ]; then \
	        echo "$$t: exit status $$rc with no failed test"; \
	        failed=$$((failed + 1)); \
	    fi; \
	done; \
	echo "tests: $$passed passed, $$failed failed"; \
	[ $$failed -eq 0 ]

check: test

# make bench: the cluster planner's and the searches' speed, as ratios
# against baselines measured in the same run
include bench/bench.mk

accuracy: all
	./$(BIN) validate ../shared/groundtruth/h200-torch2.11-cases.jsonl \
	    --gpu h200
	./$(BIN) validate ../shared/groundtruth/h200-torch2.11-maxbatch.jsonl
	./$(BIN) validate groundtruth/h200-torch2.11-extra.jsonl --gpu h200

# make equiv: every command of a broad grid run with this tree's binary and
# with EQUIV_BASE's (built apart under build/equiv/), outputs compared byte
# for byte
EQUIV_BASE ?= main
equiv:
	scripts/equiv.sh $(EQUIV_BASE)

# vp-calibrate links only the CUDA runtime (static); cuBLASLt and NCCL are
# loaded at run time. NVCC_ARCH: machine code for Ampere, Ada, Hopper and
# Blackwell, plus PTX that newer GPUs compile at load.
NVCC_ARCH ?= -gencode arch=compute_80,code=sm_80 \
             -gencode arch=compute_89,code=sm_89 \
             -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_100,code=sm_100 \
             -gencode arch=compute_100,code=compute_100
CU_FLAGS = -std=c++17 $(NVCC_ARCH) -Xcompiler -Wall,-Wextra
CU_LIBS = -ldl

ifeq ($(NVCC),)
calibrate:
	@echo "nvcc not found (set NVCC=/path/to/nvcc), skipped calibrate"
else
calibrate: $(CU_BINS)
	@$(if $(CU_SRCS),:,echo "calibrate: no calibrate/*.cu sources, nothing to build")

build/calibrate/%: calibrate/%.cu
	@mkdir -p $(@D)
	$(NVCC) $(CU_FLAGS) $(NVCCFLAGS) -o $@ $< $(CU_LIBS)
endif

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib \
	    $(DESTDIR)$(PREFIX)/include/vramplan
	install -m 755 $(BIN) $(DESTDIR)$(PREFIX)/bin/vramplan
	install -m 644 $(LIB) $(DESTDIR)$(PREFIX)/lib/libvramplan.a
	install -m 644 $(HEADERS) $(DESTDIR)$(PREFIX)/include/vramplan

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/vramplan \
	    $(DESTDIR)$(PREFIX)/lib/libvramplan.a \
	    $(HEADERS:include/%=$(DESTDIR)$(PREFIX)/include/%)
	rmdir $(DESTDIR)$(PREFIX)/include/vramplan 2>/dev/null || true

clean:
	rm -rf build vramplan libvramplan.a
