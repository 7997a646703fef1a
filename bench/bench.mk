# Benchmarks of the cluster planner and the simulator: make bench (from the
# top Makefile, which includes this file). Each bench/*.c is a program
# linked against the library and run from the repository root; it prints
# its figures as ratios against baselines measured in the same run (no
# pass/fail).
#
# bench_sim also runs the issue's baseline simulator in the same process:
# the commit issue 11 was filed against (BENCH_BASE_REV, the parent of the
# first speed commit cb6d1e5), extracted with git archive into
# $(BENCH_BASE)/src, built there with its own Makefile, and joined with
# bench/baseline/sim_base.c into one object whose only global symbols are
# vp_bench_base_*. Without git or that commit, bench_sim runs alone and
# says so.

BENCH_SRCS := $(wildcard bench/*.c)
BENCH_BINS := $(BENCH_SRCS:bench/%.c=$(BUILD)/bench/%)
BENCH_BASE_REV := 4e1f9deff04673422bd6355115f47739a5b6c1b6
BENCH_BASE := $(BUILD)/bench/baseline
BENCH_BASE_OBJ := $(if $(shell git cat-file -e $(BENCH_BASE_REV)^{commit} \
                        2>/dev/null && echo y),$(BENCH_BASE)/base.o)

.PHONY: bench bench-instr

bench: $(BENCH_BINS)
	@for b in $(BENCH_BINS); do \
	    printf '    %-4s %s\n' BENCH "$$b"; \
	    ./$$b || exit 1; \
	done

# Instructions per event of both simulators (callgrind, deterministic):
# one simulation of each setup, counted inside vp_simulate.
bench-instr: $(BUILD)/bench/bench_sim
	@command -v valgrind >/dev/null || { echo 'bench-instr: no valgrind'; exit 1; }
	@bench/instr.sh $(BUILD)/bench/bench_sim

$(BUILD)/bench/%: bench/%.c $(LIB)
	@mkdir -p $(@D)
	$(QUIET_LINK)$(CC) $(VP_CFLAGS) $(CFLAGS) -MMD -MP $(VP_LDFLAGS) \
	    $(LDFLAGS) -o $@ $< $(LIB) $(VP_LIBS)

$(BUILD)/bench/bench_sim: bench/bench_sim.c $(LIB) $(BENCH_BASE_OBJ)
	@mkdir -p $(@D)
	$(QUIET_LINK)$(CC) $(VP_CFLAGS) $(CFLAGS) -MMD -MP $(VP_LDFLAGS) \
	    $(if $(BENCH_BASE_OBJ),-DVP_BENCH_BASE='"$(BENCH_BASE)/src/"') \
	    $(LDFLAGS) -o $@ $< $(BENCH_BASE_OBJ) $(LIB) $(VP_LIBS)

# The baseline's library, built once (its sources never change).
$(BENCH_BASE)/src/libvramplan.a:
	@rm -rf $(BENCH_BASE)/src && mkdir -p $(BENCH_BASE)/src
	git archive $(BENCH_BASE_REV) | tar -x -C $(BENCH_BASE)/src
	$(MAKE) -C $(BENCH_BASE)/src libvramplan.a CFLAGS='$(CFLAGS)' \
	    SANITIZE='$(SANITIZE)'

# The adapter and the baseline library in one relocatable object; every
# symbol but the adapter's made local, so that none clashes with this
# tree's library.
$(BENCH_BASE)/base.o: bench/baseline/sim_base.c $(BENCH_BASE)/src/libvramplan.a
	$(QUIET_CC)$(CC) -std=c11 -Wall -Wextra $(CFLAGS) $(SAN_FLAGS) \
	    -I$(BENCH_BASE)/src/include $(PKG_CFLAGS) -c -o $(BENCH_BASE)/adapter.o $<
	$(LD) -r -o $(BENCH_BASE)/joined.o $(BENCH_BASE)/adapter.o \
	    $(BENCH_BASE)/src/libvramplan.a
	objcopy --keep-global-symbol=vp_bench_base_open \
	    --keep-global-symbol=vp_bench_base_sim \
	    --keep-global-symbol=vp_bench_base_close \
	    $(BENCH_BASE)/joined.o $@

-include $(BENCH_BINS:=.d)
