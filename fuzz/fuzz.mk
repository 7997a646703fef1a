# Fuzzing (docs/LIMITS.md, "Fuzzing").
#
#   make fuzz             the libFuzzer harnesses (clang), build/fuzz/fuzz_*
#   make fuzz-run         each harness (FUZZ_RUN: some) for FUZZ_SECONDS
#                         (default 10) from
#                         its seeds (models/, tests/data) and fuzz/corpus/,
#                         with its dictionary; a crash, a leak, a run over
#                         FUZZ_TIMEOUT s or FUZZ_RSS_MB MiB fails
#   make test             replays fuzz/corpus/ through every harness built
#                         without libFuzzer (tests/fuzz/run.sh)
#
# The libFuzzer builds use ASan, UBSan (float-cast-overflow included) and
# the library's sources compiled apart under build/fuzz/obj.

FUZZ_CC ?= clang
FUZZ_SECONDS ?= 10
FUZZ_TIMEOUT ?= 5
FUZZ_RSS_MB ?= 1024
FUZZ_HARNESSES := model sim case gpu units lengths config
FUZZ_SAN := -fsanitize=address,undefined,float-cast-overflow \
            -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_CFLAGS := -std=c11 -g -O1 -Iinclude $(PKG_CFLAGS) $(FUZZ_SAN)
FUZZ_OBJS := $(LIB_SRCS:%.c=build/fuzz/obj/%.o)
FUZZ_BINS := $(FUZZ_HARNESSES:%=build/fuzz/fuzz_%)
# Replays of the corpus, built with $(CC) and the sanitizers of the build.
FUZZ_REPLAYS := $(FUZZ_HARNESSES:%=$(BUILD)/fuzz/replay_%)

.PHONY: fuzz fuzz-run fuzz-seeds

build/fuzz/obj/%.o: %.c
	@mkdir -p $(@D)
	$(QUIET_CC)$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP \
	    -c $< -o $@

build/fuzz/obj/src/resource.o: $(BUILD)/gen/paths.h
build/fuzz/obj/src/resource.o: FUZZ_CFLAGS += -I$(BUILD)/gen
.SECONDARY: $(FUZZ_OBJS)

build/fuzz/fuzz_%: fuzz/fuzz_%.c $(FUZZ_OBJS)
	$(QUIET_LINK)$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $^ -o $@ \
	    $(VP_LIBS)

$(BUILD)/fuzz/replay_%: fuzz/fuzz_%.c fuzz/replay_main.c $(LIB)
	@mkdir -p $(@D)
	$(QUIET_LINK)$(CC) $(VP_CFLAGS) $(CFLAGS) fuzz/fuzz_$*.c \
	    fuzz/replay_main.c -o $@ $(VP_LDFLAGS) $(LIB) $(VP_LIBS)

fuzz: $(FUZZ_BINS)

# Seeds: models (a leading byte picks YAML or JSON for fuzz_model, the
# setup for fuzz_sim), GPU profiles, case lines, size strings.
fuzz-seeds:
	@rm -rf build/fuzz/seeds; \
	for h in $(FUZZ_HARNESSES); do mkdir -p build/fuzz/seeds/$$h; done; \
	i=0; for f in models/*.yaml tests/data/good/*.yaml \
	              tests/data/bad/*.yaml; do \
	    [ -f "$$f" ] || continue; i=$$((i + 1)); \
	    { printf 0; cat "$$f"; } > build/fuzz/seeds/model/y$$i; \
	    { printf '\000\000'; cat "$$f"; } > build/fuzz/seeds/sim/y$$i; \
	done; \
	for f in tests/data/hf/*.json; do \
	    i=$$((i + 1)); { printf 1; cat "$$f"; } > build/fuzz/seeds/model/j$$i; \
	done; \
	for f in gpus/*.yaml tests/data/gpu/*.yaml; do \
	    [ -f "$$f" ] || continue; i=$$((i + 1)); \
	    cp "$$f" build/fuzz/seeds/gpu/g$$i; \
	done; \
	for f in tests/data/validate/*.jsonl; do \
	    n=0; while IFS= read -r l && [ $$n -lt 40 ]; do \
	        n=$$((n + 1)); i=$$((i + 1)); \
	        printf '%s' "$$l" > build/fuzz/seeds/case/c$$i; \
	    done < "$$f"; \
	done; \
	for f in tests/data/batching/*.txt; do \
	    i=$$((i + 1)); cp "$$f" build/fuzz/seeds/lengths/l$$i; \
	done; \
	for f in tests/data/hf/*.json tests/data/good/hf-*.json; do \
	    i=$$((i + 1)); cp "$$f" build/fuzz/seeds/config/h$$i; \
	done; \
	for s in 1 1.5GiB 80GB 0 1e400 -3 24G 512MiB 1KiB 18446744073709551615 \
	         allocated=0.01/0.1 max_batch=1.5; do \
	    i=$$((i + 1)); printf '%s' "$$s" > build/fuzz/seeds/units/u$$i; \
	done

# FUZZ_DIR (default build/fuzz/work) keeps what each run adds to its corpus;
# FUZZ_RUN picks harnesses (default all).
FUZZ_DIR ?= build/fuzz/work
FUZZ_RUN ?= $(FUZZ_HARNESSES)
fuzz-run: fuzz fuzz-seeds
	@set -e; for h in $(FUZZ_RUN); do \
	    mkdir -p $(FUZZ_DIR)/$$h fuzz/corpus/$$h; \
	    echo "    FUZZ $$h ($(FUZZ_SECONDS) s)"; \
	    ./build/fuzz/fuzz_$$h -max_total_time=$(FUZZ_SECONDS) \
	        -timeout=$(FUZZ_TIMEOUT) -rss_limit_mb=$(FUZZ_RSS_MB) \
	        -malloc_limit_mb=$(FUZZ_RSS_MB) -max_len=65536 \
	        -dict=fuzz/dict/$$h.dict -print_final_stats=1 \
	        -artifact_prefix=$(FUZZ_DIR)/$$h- \
	        $(FUZZ_DIR)/$$h build/fuzz/seeds/$$h fuzz/corpus/$$h \
	        2>&1 | grep -E '^(#[0-9]+[[:space:]]+(DONE|INITED)|stat::number_of_executed_units|stat::peak_rss|==|SUMMARY|artifact|Done)' || true; \
	    ls $(FUZZ_DIR)/$$h-* >/dev/null 2>&1 && \
	        { echo "fuzz: $$h found an input: $$(ls $(FUZZ_DIR)/$$h-*)"; exit 1; }; \
	done; echo "fuzz: nothing found"

-include $(FUZZ_OBJS:.o=.d)
