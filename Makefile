# LokaDB build. `make deps` installs what is missing, `make` builds, `make check` tests.
#   make SANITIZE=address,undefined check   -- the sanitizer build (objects kept apart)

# config.mk is written by ./configure (pkg-config flags of the six libraries). On a fresh
# machine it does not exist yet: make builds it first (GNU make remakes an included file
# before any goal), and its rule installs the missing packages before configure looks for
# them. `make deps` and `make clean` need no config.mk.
ifeq ($(MAKECMDGOALS),)
include config.mk
else ifneq ($(filter-out deps clean,$(MAKECMDGOALS)),)
include config.mk
endif

PREFIX ?= /usr/local
CC ?= cc
PYTHON ?= /usr/bin/python3
SANITIZE ?=

CFLAGS_BASE = -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -O2 -g -Iinclude -Isrc -DLOKADB_PLUGIN_DIR=\"$(PREFIX)/lib/lokadb/plugins\"
ifneq ($(SANITIZE),)
BUILD = build/san
SANFLAGS = -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
else
BUILD = build/rel
SANFLAGS =
endif
CFLAGS += $(CFLAGS_BASE) $(SANFLAGS) $(DEP_CFLAGS)
LDFLAGS += $(SANFLAGS)

CORE_SRCS = $(filter-out src/main.c,$(wildcard src/*.c))
CORE_OBJS = $(patsubst src/%.c,$(BUILD)/src/%.o,$(CORE_SRCS))
UNIT_SRCS = $(wildcard test/unit/test_*.c)
UNIT_BINS = $(patsubst test/unit/%.c,$(BUILD)/unit/%,$(UNIT_SRCS))

ifneq ($(SANITIZE),)
BIN = $(BUILD)/lokadb
else
BIN = lokadb
endif

.PHONY: all deps check check-san unit integration bench demo install clean fuzz docs plugins test-plugins test-tools

all: config.mk $(BIN) plugins

# ---- the tunnel multiplexer (plugins/tunnel/): shared code, not a plugin. The relay and agent
# plugins compile it in (PLUGIN_EXTRA_SRCS_<name>); unit tests link MUX_OBJS, fuzz_mux its source.
MUX_DIR = plugins/tunnel
MUX_SRCS = $(filter-out $(TUNNEL_LINK_SRCS),$(wildcard $(MUX_DIR)/*.c))
# link.c: the session's libevent/TLS glue, for the plugins only (the mux itself does no I/O)
TUNNEL_LINK_SRCS = $(MUX_DIR)/link.c
MUX_HDRS = $(wildcard $(MUX_DIR)/*.h)
MUX_OBJS = $(patsubst $(MUX_DIR)/%.c,$(BUILD)/mux/%.o,$(MUX_SRCS))
PLUGIN_LIBS = tunnel
PLUGIN_EXTRA_SRCS_relay = $(MUX_SRCS) $(TUNNEL_LINK_SRCS)
PLUGIN_EXTRA_SRCS_agent = $(MUX_SRCS) $(TUNNEL_LINK_SRCS)
PLUGIN_EXTRA_CFLAGS_relay = -I$(MUX_DIR)
PLUGIN_EXTRA_CFLAGS_agent = -I$(MUX_DIR)
.SECONDARY: $(MUX_OBJS)
$(BUILD)/mux/%.o: $(MUX_DIR)/%.c $(MUX_HDRS) config.mk
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(MUX_DIR) -c -o $@ $<

# ---- plugins: plugins/NAME/*.c -> plugins/NAME/NAME.so (sanitizer builds: $(BUILD)/plugins/NAME/NAME.so)
PLUGIN_NAMES = $(filter-out $(PLUGIN_LIBS),$(patsubst plugins/%/,%,$(sort $(dir $(wildcard plugins/*/*.c)))))
ifneq ($(SANITIZE),)
PLUGIN_OUT = $(BUILD)/plugins
else
PLUGIN_OUT = plugins
endif
PLUGIN_CFLAGS = $(CFLAGS) -fPIC -fvisibility=hidden -shared
PLUGIN_SOS = $(foreach n,$(PLUGIN_NAMES),$(PLUGIN_OUT)/$(n)/$(n).so)
define plugin_rule
$(PLUGIN_OUT)/$(1)/$(1).so: $(wildcard plugins/$(1)/*.c plugins/$(1)/*.h plugins/$(1)/*.sql) $(wildcard include/lokadb/*.h) $$(PLUGIN_EXTRA_SRCS_$(1)) config.mk
	@mkdir -p $$(dir $$@)
	$$(CC) $$(PLUGIN_CFLAGS) -Iplugins/$(1) $$(PLUGIN_EXTRA_CFLAGS_$(1)) -o $$@ $(wildcard plugins/$(1)/*.c) $$(PLUGIN_EXTRA_SRCS_$(1)) $$(SANFLAGS) $$(DEP_LIBS)
	$(if $(filter-out plugins,$(PLUGIN_OUT)),@for f in $(wildcard plugins/$(1)/*.sql); do cp -f $$$$f $$(dir $$@); done)
endef
$(foreach n,$(PLUGIN_NAMES),$(eval $(call plugin_rule,$(n))))
plugins: $(PLUGIN_SOS)

# ---- test plugins: test/plugins/NAME.c -> $(BUILD)/test-plugins/NAME.so (built by make check, not installed)
TEST_PLUGIN_SRCS = $(wildcard test/plugins/*.c)
TEST_PLUGINS = $(patsubst test/plugins/%.c,$(BUILD)/test-plugins/%.so,$(TEST_PLUGIN_SRCS))
$(BUILD)/test-plugins/%.so: test/plugins/%.c $(wildcard include/lokadb/*.h test/plugins/*.h) config.mk
	@mkdir -p $(dir $@)
	$(CC) $(PLUGIN_CFLAGS) -Itest/plugins -o $@ $< $(SANFLAGS) $(DEP_LIBS)
test-plugins: $(TEST_PLUGINS)

config.mk:
	@sh tools/deps.sh
	./configure

$(BIN): $(CORE_OBJS) $(BUILD)/src/main.o
	$(CC) $(LDFLAGS) -o $@ $^ $(DEP_LIBS)

$(BUILD)/src/%.o: src/%.c $(wildcard src/*.h include/lokadb/*.h) config.mk
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/unit/%: test/unit/%.c test/unit/unit.h $(CORE_OBJS) $(MUX_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itest/unit -I$(MUX_DIR) -o $@ $< $(CORE_OBJS) $(MUX_OBJS) $(LDFLAGS) $(DEP_LIBS)

# ---- test tools: test/tools/NAME.c -> $(BUILD)/tools/NAME (libevent programs used by the tests)
TOOL_SRCS = $(wildcard test/tools/*.c)
TOOLS = $(patsubst test/tools/%.c,$(BUILD)/tools/%,$(TOOL_SRCS))
$(BUILD)/tools/%: test/tools/%.c config.mk
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(LDFLAGS) $(DEP_LIBS)
# mux_bench and tunnel_hello speak the tunnel's protocol: they compile the mux sources in.
$(BUILD)/tools/mux_bench $(BUILD)/tools/tunnel_hello: $(BUILD)/tools/%: test/tools/%.c $(MUX_SRCS) $(MUX_HDRS) config.mk
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(MUX_DIR) -o $@ $< $(MUX_SRCS) $(LDFLAGS) $(DEP_LIBS)
# agent_swarm opens many agent sessions (TLS + the mux handshake): it compiles the mux sources in.
$(BUILD)/tools/agent_swarm: test/tools/agent_swarm.c $(MUX_SRCS) $(MUX_HDRS) config.mk
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(MUX_DIR) -o $@ $< $(MUX_SRCS) $(LDFLAGS) $(DEP_LIBS)
test-tools: $(TOOLS)

unit: $(UNIT_BINS)
	@sh test/unit/run.sh $(UNIT_BINS)

# pytest's summary line must end the run: a -q of PYTEST_ARGS on top of ours (-qq) would drop it.
integration: all test-plugins test-tools
	cd test/integration && LOKADB_BIN=$(abspath $(BIN)) LOKADB_SANITIZE=$(SANITIZE) \
		LOKADB_TOOLS_DIR=$(abspath $(BUILD)/tools) \
		LOKADB_PLUGIN_DIR=$(abspath $(PLUGIN_OUT)) \
		LOKADB_TEST_PLUGIN_DIR=$(abspath $(BUILD)/test-plugins) \
		$(PYTHON) -m pytest -q -p no:cacheprovider $(filter-out -q -qq -qqq --quiet,$(PYTEST_ARGS))

check: deps all unit fuzz-smoke integration check-san

# The sanitizer pass of `make check`: the same unit and integration tests again on an
# AddressSanitizer + UndefinedBehaviorSanitizer build (objects in build/san). Skipped when
# this run is itself a sanitizer build, or with CHECK_SAN=0.
CHECK_SAN ?= 1
check-san:
ifeq ($(SANITIZE),)
ifneq ($(CHECK_SAN),0)
	@$(MAKE) --no-print-directory SANITIZE=address,undefined all test-plugins unit integration
endif
endif

# ---- fuzzing (clang + libFuzzer from libclang-rt-14-dev) ----
FUZZ_SRCS = $(wildcard test/fuzz/fuzz_*.c)
FUZZ_BINS = $(patsubst test/fuzz/%.c,build/fuzz/%,$(FUZZ_SRCS))
FUZZ_CORE = $(filter-out src/main.c,$(wildcard src/*.c))
build/fuzz/%: test/fuzz/%.c test/fuzz/harness.h $(FUZZ_CORE) $(wildcard src/*.h)
	@mkdir -p build/fuzz
	clang -std=c11 -D_GNU_SOURCE -g -O1 -Iinclude -Isrc $(DEP_CFLAGS) \
		-fsanitize=fuzzer,address,undefined -o $@ $< $(FUZZ_CORE) $(DEP_LIBS)
# fuzz_mux drives the multiplexer alone: it needs no core objects.
build/fuzz/fuzz_mux: test/fuzz/fuzz_mux.c $(MUX_SRCS) $(MUX_HDRS)
	@mkdir -p build/fuzz
	clang -std=c11 -D_GNU_SOURCE -g -O1 -I$(MUX_DIR) -fsanitize=fuzzer,address,undefined -o $@ $< $(MUX_SRCS)
fuzz: $(FUZZ_BINS)
# Each target runs FUZZ_SECONDS on a scratch copy of its seeds; crashes land in build/fuzz/.
FUZZ_SECONDS ?= 20
fuzz-smoke: $(FUZZ_BINS)
	@for f in $(FUZZ_BINS); do n=$$(basename $$f); echo "fuzz: $$n ($(FUZZ_SECONDS) s)"; \
		rm -rf build/fuzz/$$n.corpus && mkdir -p build/fuzz/$$n.corpus; \
		$$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 -artifact_prefix=build/fuzz/$$n- \
			build/fuzz/$$n.corpus test/fuzz/corpus/$$n >/dev/null 2>build/fuzz/$$n.log \
		|| { tail -40 build/fuzz/$$n.log; exit 1; }; \
		grep -E "stat::number_of_executed_units" build/fuzz/$$n.log | sed "s/^/  $$n /"; done

bench: all test-plugins test-tools
	LOKADB_TEST_PLUGIN_DIR=$(abspath $(BUILD)/test-plugins) LOKADB_TOOLS_DIR=$(abspath $(BUILD)/tools) \
		$(PYTHON) bench/run.py

demo: deps all
	sh etc/demo.sh

docs: all
	./$(BIN) --describe-config > doc/config.md

deps:
	@sh tools/deps.sh

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/doc/lokadb $(DESTDIR)$(PREFIX)/share/lokadb/etc
	install -m 755 lokadb $(DESTDIR)$(PREFIX)/bin/lokadb
	install -d $(DESTDIR)$(PREFIX)/lib/lokadb/plugins $(DESTDIR)$(PREFIX)/include/lokadb
	install -m 644 include/lokadb/*.h $(DESTDIR)$(PREFIX)/include/lokadb/
	for n in $(PLUGIN_NAMES); do install -d $(DESTDIR)$(PREFIX)/lib/lokadb/plugins/$$n; \
		install -m 755 plugins/$$n/$$n.so $(DESTDIR)$(PREFIX)/lib/lokadb/plugins/$$n/; \
		for f in plugins/$$n/*.sql; do [ -e "$$f" ] && install -m 644 "$$f" $(DESTDIR)$(PREFIX)/lib/lokadb/plugins/$$n/ || true; done; done
	install -m 644 doc/*.md README.md $(DESTDIR)$(PREFIX)/share/doc/lokadb/
	install -m 644 etc/*.ini etc/*.txt $(DESTDIR)$(PREFIX)/share/lokadb/etc/

clean:
	rm -rf build lokadb plugins/*/*.so
