# vramplan: GPU memory planner for deep-learning training.
#
#   make                  libvramplan.a and ./vramplan
#   make run              check dependencies, build, estimate GPT-2 small
#   make test             check dependencies, build and run the tests
#   make test SANITIZE=address,undefined
#                         the same, built with sanitizers under build/san-*
#   make deps             check (and as root, install) the Debian packages
#   make install          PREFIX=/usr/local, DESTDIR for staging: the
#                         program, libvramplan.a and libvramplan.so, the
#                         headers, vramplan.pc, the man page, the GPU
#                         profiles and models (share/vramplan) and the
#                         Python package (lib/vramplan/python)
#   make calibrate        the CUDA calibration programs, when nvcc is found
#   make accuracy         compare with the measured ground truth
#   make equiv            this tree's output against EQUIV_BASE's (default
#                         main), byte for byte (scripts/equiv.sh)
#   make mutants          mutate the rules one at a time (scripts/mutants.tsv)
#                         and run the tests on each (long: not part of
#                         make test); MUTANTS_ARGS, e.g. --only ID,ID
#   make clean
#
# Variables: CC, CFLAGS (default -O2 -g), LDFLAGS, PREFIX, DESTDIR,
# BINDIR, LIBDIR, INCLUDEDIR, DATADIR, MANDIR, PKGCONFIGDIR, PYTHONDIR,
# PKG_CONFIG, NVCC, PYTHON (default python3), SANITIZE (comma list of
# address, undefined, leak, thread; SANITIZER is accepted too), V=1 for
# the full commands.

CC ?= cc
AR ?= ar
CFLAGS ?= -O2 -g
LDFLAGS ?=
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
DATADIR ?= $(PREFIX)/share
MANDIR ?= $(DATADIR)/man
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
PYTHONDIR ?= $(LIBDIR)/vramplan/python
PKG_CONFIG ?= pkg-config
PYTHON ?= python3
NVCC ?= $(shell command -v nvcc 2>/dev/null)
include replay/replay.mk
NVCCFLAGS ?= -O2
SANITIZE ?= $(SANITIZER)

# Debian packages the build and the tests need, as package:pkg-config-module
# (empty module: the package provides the pkg-config program itself).
DEB_PACKAGES := pkg-config: libyaml-dev:yaml-0.1 libgsl-dev:gsl \
                libjansson-dev:jansson libcriterion-dev:criterion
# Programs the tests run, as package:program: the Python package's tests
# and the install test (man shows the installed page).
DEB_TOOLS := python3:python3 man-db:man

# The library's version (vramplan.h) and the shared library's names.
VERSION := $(shell sed -n 's/^\#define VRAMPLAN_VERSION "\(.*\)"/\1/p' \
                   include/vramplan/vramplan.h)
SOVERSION := $(firstword $(subst ., ,$(VERSION)))

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
  # UBSan leaves out float-to-integer overflow (an inf cast to uint64_t)
  ifneq ($(filter undefined,$(subst $(comma), ,$(SANITIZE))),)
    SAN_FLAGS += -fsanitize=float-cast-overflow
  endif
  TEST_ENV := ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:malloc_context_size=2 \
              LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
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
PKG_CFLAGS := $(shell $(PKG_CONFIG) --cflags yaml-0.1 gsl jansson 2>/dev/null)
PKG_LIBS := $(shell $(PKG_CONFIG) --libs yaml-0.1 gsl jansson 2>/dev/null || \
                    echo -lyaml -lgsl -lgslcblas -ljansson)
CRITERION_CFLAGS := $(shell $(PKG_CONFIG) --cflags criterion 2>/dev/null)
CRITERION_LIBS := $(shell $(PKG_CONFIG) --libs criterion 2>/dev/null || \
                          echo -lcriterion)

VP_CFLAGS = -std=c11 -Wall -Wextra -Wpedantic -Wshadow -Wstrict-prototypes \
            -Iinclude $(PKG_CFLAGS) $(SAN_FLAGS)
VP_LDFLAGS = $(SAN_FLAGS)
VP_LIBS = $(PKG_LIBS) -lm -ldl

# The shared library: libvramplan.so.VERSION with the soname
# libvramplan.so.SOVERSION, exporting the public vp_ names only
# (src/libvramplan.map); links to it sit beside it.
SHLIB_REAL := libvramplan.so.$(VERSION)
SHLIB_SONAME := libvramplan.so.$(SOVERSION)
SHLIB := $(BUILD)/$(SHLIB_REAL)
# Test fixtures: a fake NVML for the watch tests (never sanitized: it is
# loaded into the program under test like the real one).
FAKE_NVML := $(BUILD)/tests/libfake_nvml.so

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
        print-prefix equiv mutants

all: $(LIB) $(BIN) $(SHLIB)

$(BUILD)/%.o: %.c
	@mkdir -p $(@D)
	$(QUIET_CC)$(CC) $(VP_CFLAGS) $(EXTRA_CFLAGS) $(CFLAGS) -MMD -MP \
	    -c $< -o $@

$(TEST_OBJS): EXTRA_CFLAGS = $(CRITERION_CFLAGS)
# Library objects go into the shared library too.
$(LIB_OBJS): EXTRA_CFLAGS = -fPIC

# The search path's directories (src/resource.c): the data directory of
# PREFIX and the source tree, rewritten only when they change.
$(BUILD)/gen/paths.h: FORCE
	@mkdir -p $(@D)
	@printf '#define VP_DATADIR "%s/vramplan"\n#define VP_SRCDIR "%s"\n' \
	    '$(DATADIR)' '$(CURDIR)' >$@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi
$(BUILD)/src/resource.o: $(BUILD)/gen/paths.h
$(BUILD)/src/resource.o: EXTRA_CFLAGS = -fPIC -I$(BUILD)/gen
.PHONY: FORCE
FORCE:

$(LIB): $(LIB_OBJS)
	@mkdir -p $(@D)
	@rm -f $@
	$(QUIET_AR)$(AR) rcs $@ $^

$(SHLIB): $(LIB_OBJS) src/libvramplan.map
	$(QUIET_LINK)$(CC) -shared -Wl,-soname,$(SHLIB_SONAME) \
	    -Wl,--version-script,src/libvramplan.map $(VP_LDFLAGS) $(CFLAGS) \
	    $(LDFLAGS) -o $@ $(LIB_OBJS) $(VP_LIBS)
	@ln -sf $(SHLIB_REAL) $(BUILD)/$(SHLIB_SONAME)
	@ln -sf $(SHLIB_SONAME) $(BUILD)/libvramplan.so

$(FAKE_NVML): tests/fake_nvml.c
	@mkdir -p $(@D)
	$(QUIET_LINK)$(CC) -std=c11 -Wall -Wextra -fPIC -shared $(CFLAGS) \
	    $(LDFLAGS) -o $@ $<

# --as-needed: the program links only the libraries it uses
$(BIN): $(CLI_OBJS) $(LIB)
	$(QUIET_LINK)$(CC) $(VP_LDFLAGS) -Wl,--as-needed $(CFLAGS) $(LDFLAGS) -o $@ \
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
	for entry in $(DEB_TOOLS); do \
	    pkg=$${entry%%:*}; prog=$${entry#*:}; \
	    command -v $$prog >/dev/null 2>&1 || missing="$$missing $$pkg"; \
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
# (Failing includes Crashing) and the skipped tests of its TAP report. A
# binary that exits non-zero with no failed test (a sanitizer report at
# exit, a Criterion warning) or prints no synthesis counts as one failure,
# and so does a skipped test: a test never passes by skipping. The test
# scripts print the same synthesis line: the Python package's tests
# (tests/python) and the install test (tests/install), which installs into
# a temporary directory. Then every ground-truth file is validated against
# its bounds (ACCURACY_CHECK).
TEST_SCRIPTS := tests/python/run.sh tests/install/run.sh tests/fuzz/run.sh \
                tests/style/run.sh
TEST_VARS = VRAMPLAN_BIN=./$(BIN) VRAMPLAN_LIB=$(CURDIR)/$(SHLIB) \
            VRAMPLAN_FAKE_NVML=$(CURDIR)/$(FAKE_NVML) PYTHON=$(PYTHON) \
            VP_SANITIZE=$(SANITIZE) VP_SAN_FLAGS='$(SAN_FLAGS)' CC='$(CC)' \
            MAKE='$(MAKE)' PKG_CONFIG='$(PKG_CONFIG)' \
            VP_FUZZ_REPLAYS='$(FUZZ_REPLAYS)'

test: deps
	@$(MAKE) --no-print-directory all $(TEST_BINS) $(FAKE_NVML) \
	    $(FUZZ_REPLAYS)
	+@passed=0; failed=0; skipped=0; tap=$$(mktemp); \
	for t in $(TEST_BINS) $(TEST_SCRIPTS); do \
	    printf '    %-4s %s\n' TEST "$$t"; \
	    : > $$tap; \
	    out=$$($(TEST_VARS) $(TEST_ENV) ./$$t --tap=$$tap 2>&1); rc=$$?; \
	    printf '%s\n' "$$out"; \
	    line=$$(printf '%s\n' "$$out" | grep 'Synthesis: Tested:' | tail -n 1); \
	    p=$$(printf '%s' "$$line" | sed -n 's/.*Passing: *\([0-9]*\).*/\1/p'); \
	    f=$$(printf '%s' "$$line" | sed -n 's/.*Failing: *\([0-9]*\).*/\1/p'); \
	    s=$$(grep -c '# SKIP' $$tap); \
	    grep '# SKIP' $$tap | sed 's/^/    skipped: /'; \
	    skipped=$$((skipped + s)); \
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
	rm -f $$tap; \
	over=0; $(ACCURACY_CHECK); \
	echo "tests: $$passed passed, $$failed failed, $$skipped skipped; accuracy: $$over files over their bounds"; \
	[ $$failed -eq 0 ] && [ $$skipped -eq 0 ] && [ $$over -eq 0 ]

# The accuracy check of make test: validate every ground-truth file
# against its section of groundtruth/bounds.json (median and largest
# error per metric group, documented outliers): the shared folder's
# *.jsonl and dist/*.jsonl when ../shared/groundtruth exists, else the
# copy in tests/data/groundtruth, and this repository's groundtruth/.
# A file without a section fails: give a new set its bounds.
GT_SHARED ?= ../shared/groundtruth
GT_COPY := tests/data/groundtruth
GT_BOUNDS := groundtruth/bounds.json
ACCURACY_CHECK = \
	if [ -d $(GT_SHARED) ]; then gt=$(GT_SHARED); else gt=$(GT_COPY); fi; \
	echo "    ACCURACY ground truth from $$gt and groundtruth/"; \
	for f in $$gt/*.jsonl $$gt/dist/*.jsonl groundtruth/*.jsonl \
	         groundtruth/dist/*.jsonl groundtruth/heldout/*.jsonl; do \
	    [ -e "$$f" ] || continue; \
	    err=$$($(TEST_ENV) ./$(BIN) validate --gpu h200 \
	           --outliers $(GT_BOUNDS) "$$f" 2>&1 >/dev/null); \
	    if [ $$? -eq 0 ]; then \
	        printf '    %-4s %s: within its bounds\n' OK "$$f"; \
	    else \
	        printf '%s\n' "$$err"; over=$$((over + 1)); \
	    fi; \
	done

check: test

# make bench: the cluster planner's and the searches' speed, as ratios
# against baselines measured in the same run
include bench/bench.mk

# make fuzz, make fuzz-run: the libFuzzer harnesses (fuzz/)
include fuzz/fuzz.mk

# make accuracy: the full comparison, file by file, with the bounds
accuracy: all
	@if [ -d $(GT_SHARED) ]; then gt=$(GT_SHARED); else gt=$(GT_COPY); fi; \
	rc=0; for f in $$gt/*.jsonl $$gt/dist/*.jsonl groundtruth/*.jsonl \
	               groundtruth/dist/*.jsonl groundtruth/heldout/*.jsonl; do \
	    [ -e "$$f" ] || continue; echo "== $$f"; \
	    ./$(BIN) validate --gpu h200 --outliers $(GT_BOUNDS) "$$f" || rc=1; \
	done; exit $$rc

# make equiv: every command of a broad grid run with this tree's binary and
# with EQUIV_BASE's (built apart under build/equiv/), outputs compared byte
# for byte
EQUIV_BASE ?= main
equiv:
	scripts/equiv.sh $(EQUIV_BASE)

# make mutants: each mutation of scripts/mutants.tsv applied alone in a
# scratch copy (build/mutants/tree), rebuilt and tested until a check
# fails; the report goes to scripts/mutants.report.md (docs/MUTANTS.md)
MUTANTS_ARGS ?=
mutants: all $(TEST_BINS) $(FAKE_NVML)
	$(PYTHON) scripts/mutants.py $(MUTANTS_ARGS)

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

# Everything under DESTDIR; vramplan.pc is written with the final paths.
GPU_FILES := $(wildcard gpus/*.yaml)
MODEL_FILES := $(wildcard models/*.yaml)
PY_FILES := $(wildcard python/vramplan/*.py)

install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) \
	    $(DESTDIR)$(INCLUDEDIR)/vramplan $(DESTDIR)$(PKGCONFIGDIR) \
	    $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(DATADIR)/vramplan/gpus \
	    $(DESTDIR)$(DATADIR)/vramplan/models \
	    $(DESTDIR)$(PYTHONDIR)/vramplan
	install -m 755 $(BIN) $(DESTDIR)$(BINDIR)/vramplan
	install -m 644 $(LIB) $(DESTDIR)$(LIBDIR)/libvramplan.a
	install -m 755 $(SHLIB) $(DESTDIR)$(LIBDIR)/$(SHLIB_REAL)
	ln -sf $(SHLIB_REAL) $(DESTDIR)$(LIBDIR)/$(SHLIB_SONAME)
	ln -sf $(SHLIB_SONAME) $(DESTDIR)$(LIBDIR)/libvramplan.so
	install -m 644 $(HEADERS) $(DESTDIR)$(INCLUDEDIR)/vramplan
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' \
	    -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' -e 's|@VERSION@|$(VERSION)|' \
	    vramplan.pc.in >$(DESTDIR)$(PKGCONFIGDIR)/vramplan.pc
	install -m 644 man/vramplan.1 $(DESTDIR)$(MANDIR)/man1/vramplan.1
	install -m 644 $(GPU_FILES) $(DESTDIR)$(DATADIR)/vramplan/gpus
	install -m 644 $(MODEL_FILES) $(DESTDIR)$(DATADIR)/vramplan/models
	install -m 644 $(PY_FILES) $(DESTDIR)$(PYTHONDIR)/vramplan

print-prefix:
	@echo $(PREFIX)

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/vramplan \
	    $(DESTDIR)$(LIBDIR)/libvramplan.a \
	    $(DESTDIR)$(LIBDIR)/$(SHLIB_REAL) \
	    $(DESTDIR)$(LIBDIR)/$(SHLIB_SONAME) \
	    $(DESTDIR)$(LIBDIR)/libvramplan.so \
	    $(DESTDIR)$(PKGCONFIGDIR)/vramplan.pc \
	    $(DESTDIR)$(MANDIR)/man1/vramplan.1 \
	    $(HEADERS:include/%=$(DESTDIR)$(INCLUDEDIR)/%) \
	    $(GPU_FILES:%=$(DESTDIR)$(DATADIR)/vramplan/%) \
	    $(MODEL_FILES:%=$(DESTDIR)$(DATADIR)/vramplan/%) \
	    $(PY_FILES:python/%=$(DESTDIR)$(PYTHONDIR)/%)
	rm -rf $(DESTDIR)$(PYTHONDIR)/vramplan/__pycache__
	for d in $(INCLUDEDIR)/vramplan $(DATADIR)/vramplan/gpus \
	    $(DATADIR)/vramplan/models $(DATADIR)/vramplan \
	    $(PYTHONDIR)/vramplan $(PYTHONDIR) $(LIBDIR)/vramplan; do \
	    rmdir $(DESTDIR)$$d 2>/dev/null || true; \
	done

clean:
	rm -rf build vramplan libvramplan.a
