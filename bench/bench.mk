# Benchmarks of the cluster planner: make bench (from the top Makefile,
# which includes this file). Each bench/*.c is a program linked against
# the library and run from the repository root; it prints its figures as
# ratios against baselines measured in the same run (no pass/fail).

BENCH_SRCS := $(wildcard bench/*.c)
BENCH_BINS := $(BENCH_SRCS:bench/%.c=$(BUILD)/bench/%)

.PHONY: bench

bench: $(BENCH_BINS)
	@for b in $(BENCH_BINS); do \
	    printf '    %-4s %s\n' BENCH "$$b"; \
	    ./$$b || exit 1; \
	done

$(BUILD)/bench/%: bench/%.c $(LIB)
	@mkdir -p $(@D)
	$(QUIET_LINK)$(CC) $(VP_CFLAGS) $(CFLAGS) -MMD -MP $(VP_LDFLAGS) \
	    $(LDFLAGS) -o $@ $< $(LIB) $(VP_LIBS)

-include $(BENCH_BINS:=.d)
