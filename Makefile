# kvpool - build, test, demo, install.
#
#   make            build kvpoold, libkvpool (.so and .a), kvpool CLI into build/
#   make test       install missing build deps (Debian), build, run unit + integration + Python tests
#   make test-san   the same tests built with AddressSanitizer + UBSan (build-san/)
#   make test-valgrind  integration tests with kvpoold under valgrind (leaks fail)
#   make demo       start kvpoold, replay the bundled Mooncake trace, print the report
#   make install PREFIX=/usr/local DESTDIR=
#   make clean

PREFIX  ?= /usr/local
DESTDIR ?=
# Debian's python3 (the one python3-pytest and python3-numpy serve), and
# where it looks for packages under PREFIX: /usr/lib/python3/dist-packages,
# or /usr/local/lib/python3.X/dist-packages.
PYTHON  ?= /usr/bin/python3
PYDIR   ?= $(if $(filter /usr,$(PREFIX)),/usr/lib/python3/dist-packages,$(PREFIX)/lib/python$(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)/dist-packages)
SAN     ?= 0
CC      ?= cc

ifeq ($(SAN),1)
BUILD   ?= build-san
OPT     ?= -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
SANLD   := -fsanitize=address,undefined
else
BUILD   ?= build
OPT     ?= -O2
SANLD   :=
endif

DEB_PACKAGES := build-essential pkg-config libevent-dev libinih-dev libssl-dev libxxhash-dev libcmocka-dev libjson-c-dev \
                python3-pytest python3-numpy
PKGS    := libevent libevent_pthreads inih libcrypto libxxhash cmocka json-c
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)

CFLAGS  ?=
CFLAGS  += -std=gnu11 -g $(OPT) -Wall -Wextra -Wpointer-arith -Werror -fPIC -D_GNU_SOURCE -pthread \
           -Iproto -Istorage -Iconfig -Iclient -Iserver $(PKG_CFLAGS) -MMD -MP
LDFLAGS += $(SANLD) -pthread

LIBS_SERVER := -levent_core -levent_pthreads -levent_extra -linih -lxxhash -lm
LIBS_CLIENT := -lcrypto -lxxhash -lm
LIBS_TEST   := -lcmocka

PROTO_SRC  := $(wildcard proto/*.c)
STORE_SRC  := $(wildcard storage/*.c)
CONF_SRC   := $(wildcard config/*.c)
SERVER_SRC := $(filter-out server/main.c,$(wildcard server/*.c))
CLIENT_SRC := $(wildcard client/lib/*.c)
CLI_SRC    := $(wildcard client/cli/*.c)
UNIT_SRC   := $(wildcard tests/unit/test_*.c)
INTEG_SRC  := $(wildcard tests/integration/test_*.c)
INTEG_HELP := $(filter-out $(INTEG_SRC),$(wildcard tests/integration/*.c))

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
PROTO_OBJ  := $(call obj,$(PROTO_SRC))
STORE_OBJ  := $(call obj,$(STORE_SRC))
CONF_OBJ   := $(call obj,$(CONF_SRC))
SERVER_OBJ := $(call obj,$(SERVER_SRC))
CLIENT_OBJ := $(call obj,$(CLIENT_SRC))
CLI_OBJ    := $(call obj,$(CLI_SRC))
INTEG_HOBJ := $(call obj,$(INTEG_HELP))

KVPOOLD   := $(BUILD)/kvpoold
KVPOOL    := $(BUILD)/kvpool
LIB_A     := $(BUILD)/libkvpool.a
LIB_SO    := $(BUILD)/libkvpool.so
UNIT_BIN  := $(patsubst tests/unit/test_%.c,$(BUILD)/tests/unit_%,$(UNIT_SRC))
INTEG_BIN := $(patsubst tests/integration/test_%.c,$(BUILD)/tests/integ_%,$(INTEG_SRC))

.PHONY: all deps test test-san test-valgrind test-unit test-integration demo install clean
all: $(KVPOOLD) $(LIB_A) $(LIB_SO) $(KVPOOL)

# Install missing Debian packages (needs root or sudo). A no-op when all are present.
deps:
	@if ! pkg-config --exists $(PKGS) 2>/dev/null || ! command -v cc >/dev/null || \
	    ! $(PYTHON) -c 'import pytest, numpy' 2>/dev/null; then \
	  echo "installing build dependencies: $(DEB_PACKAGES)"; \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(DEB_PACKAGES); \
	fi

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libproto.a: $(PROTO_OBJ)
$(BUILD)/libstore.a: $(STORE_OBJ)
$(BUILD)/libconf.a: $(CONF_OBJ)
$(BUILD)/libserver.a: $(SERVER_OBJ)
$(BUILD)/libproto.a $(BUILD)/libstore.a $(BUILD)/libconf.a $(BUILD)/libserver.a:
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(KVPOOLD): $(call obj,server/main.c) $(BUILD)/libserver.a $(BUILD)/libstore.a $(BUILD)/libconf.a $(BUILD)/libproto.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_SERVER)

$(LIB_A): $(CLIENT_OBJ) $(PROTO_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(LIB_SO): $(CLIENT_OBJ) $(PROTO_OBJ) client/libkvpool.map
	$(CC) $(LDFLAGS) -shared -Wl,-soname,libkvpool.so.0 -Wl,--version-script=client/libkvpool.map \
	  -o $@ $(CLIENT_OBJ) $(PROTO_OBJ) $(LIBS_CLIENT)
	ln -sf libkvpool.so $(BUILD)/libkvpool.so.0

$(KVPOOL): $(CLI_OBJ) $(LIB_A)
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_CLIENT) -ljson-c

# Unit tests link only their module and what it depends on.
.SECONDEXPANSION:
UNIT_DEPS_proto  := $(BUILD)/libproto.a
UNIT_DEPS_store  := $(BUILD)/libstore.a
UNIT_DEPS_arena  := $(BUILD)/libstore.a
UNIT_DEPS_config := $(BUILD)/libconf.a
UNIT_DEPS_hash   := $(LIB_A)
UNIT_LIBS_hash   := -ljson-c
UNIT_FAKE        := $(call obj,tests/unit/fake_server.c)
UNIT_DEPS_client := $(UNIT_FAKE) $(LIB_A)
UNIT_DEPS_server := $(BUILD)/libserver.a $(BUILD)/libstore.a $(BUILD)/libconf.a $(BUILD)/libproto.a
UNIT_LIBS_server := $(LIBS_SERVER)
UNIT_DEPS_cli    := $(filter-out $(call obj,client/cli/main.c),$(CLI_OBJ)) $(UNIT_FAKE) $(LIB_A)
UNIT_LIBS_cli    := -ljson-c
$(BUILD)/tests/unit_%: $(call obj,tests/unit/test_%.c) $$(UNIT_DEPS_$$*)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(UNIT_LIBS_$*) $(LIBS_CLIENT) $(LIBS_SERVER) $(LIBS_TEST)

$(BUILD)/tests/integ_%: $(call obj,tests/integration/test_%.c) $(INTEG_HOBJ) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_CLIENT) $(LIBS_TEST) -ljson-c

# The Python binding's pytest suite runs as one more test program (in a
# sanitizer build, with the sanitizer runtimes preloaded into python3).
PY_TESTS := tests/python/pytest.sh

test: deps
	@$(MAKE) --no-print-directory all $(UNIT_BIN) $(INTEG_BIN)
	@BUILD=$(BUILD) tests/run.sh $(UNIT_BIN) $(INTEG_BIN) $(PY_TESTS)

# The integration tests with kvpoold under valgrind: a leak or memory error
# makes the daemon exit 99, which fails the test's clean-shutdown check.
test-valgrind: deps
	@command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)"; exit 1; }
	@$(MAKE) --no-print-directory all $(INTEG_BIN)
	@KVPOOL_VALGRIND=1 BUILD=$(BUILD) tests/run.sh $(INTEG_BIN)

test-san: deps
	@$(MAKE) --no-print-directory SAN=1 test

demo: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) tests/demo.sh

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include \
	  $(DESTDIR)$(PREFIX)/share/kvpool
	install -m 755 $(KVPOOLD) $(KVPOOL) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(LIB_A) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(LIB_SO) $(DESTDIR)$(PREFIX)/lib/libkvpool.so.0
	ln -sf libkvpool.so.0 $(DESTDIR)$(PREFIX)/lib/libkvpool.so
	install -m 644 client/kvpool.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 config/kvpool.conf $(DESTDIR)$(PREFIX)/share/kvpool/
	install -d $(DESTDIR)$(PYDIR)/kvpool
	install -m 644 client/python/kvpool/*.py $(DESTDIR)$(PYDIR)/kvpool/
	printf '"""Written by make install."""\nLIBDIR = "%s"\n' "$(PREFIX)/lib" \
	  > $(DESTDIR)$(PYDIR)/kvpool/_installed.py

clean:
	rm -rf build build-san

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
