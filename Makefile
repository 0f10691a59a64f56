# kvpool - build, test, demo, install.
#
#   make            build kvpoold, libkvpool (.so and .a), kvpool CLI into build/
#   make test       install missing build deps (Debian), build, run unit + integration + Python tests
#   make deps-check fail when an #include crosses a boundary of tests/deps_rules.txt
#                   (the layering of DESIGN.md); make test runs it first
#   make test-san   the same tests built with AddressSanitizer + UBSan (build-san/)
#   make RDMA=0 BUILD=build-nordma test   the tests with the RDMA stub (TCP only, no rdma-core)
#   make test-valgrind  integration tests with kvpoold under valgrind (leaks fail)
#   make test-tsan  the asynchronous API's tests (threads submitting, polling and making
#                   blocking calls on one handle, one node and a cluster) with libkvpool
#                   built under ThreadSanitizer (build-tsan/);
#                   make test runs it too
#   make fuzz       build the libFuzzer targets with clang, run each FUZZ_SECONDS (60)
#   make soak       the churn soak for SOAK_SECONDS (600); make test runs it for 30 s
#   make demo       start kvpoold, replay the bundled Mooncake trace, print the report
#   make demo-ttft  time to first token with and without kvpool on a reference Llama decoder
#                   (torch, CPU): two node processes share one kvpoold; correctness checks,
#                   a 1k-8k prefix sweep, the Mooncake trace; JSON + PNG in build/ttft (~5 min)
#   make demo-pd    prefill -> decode hand-off through the pool: a router, a prefill node and a
#                   decode node (MATCH that waits) on the same decoder; output checks, 1k-8k
#                   hand-off times, three failure cases; JSON + PNG in build/pd (~3 min)
#   make demo-nvme  the same trace on DRAM only, then DRAM + an NVMe tier (both admission
#                   settings): hit ratios and NVMe bytes written side by side
#   make bench      build the benchmark tools of tests/bench (tests/bench/compare.sh runs them;
#                   tests/bench/match_wait.sh the wake-up latency of waiting MATCHes)
#   make container-test  build docker/Dockerfile with buildah (no Docker engine), run kvpoold
#                   from the image, check it from the host (~10 min; not in make test, in .ci/run)
#   make install PREFIX=/usr/local DESTDIR=   binaries, library, header, kvpool.pc, the
#                   Python package (the wheel, through pip; INSTALL_PYTHON=0: not), the
#                   systemd unit and sysusers entry, /etc/kvpool/kvpool.conf (kept if present);
#                   then runs ldconfig (LDCONFIG=) unless DESTDIR is set
#   make uninstall  what make install put there (same variables), but the configuration
#   make deps-build, deps-wheel, deps-deb, deps: the Debian packages a target needs (below)
#   make wheel, make deb, make test-packaging: see "Packaging" below
#   make clean

PREFIX  ?= /usr/local
DESTDIR ?=
# Debian's python3 (the one python3-pytest and python3-numpy serve), and
# where it looks for packages under PREFIX: /usr/lib/python3/dist-packages,
# or /usr/local/lib/python3.X/dist-packages.
PYTHON  ?= /usr/bin/python3
PYDIR   ?= $(if $(filter /usr,$(PREFIX)),/usr/lib/python3/dist-packages,$(PREFIX)/lib/python$(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)/dist-packages)
SYSCONFDIR ?= /etc
SYSTEMD_UNIT_DIR ?= $(PREFIX)/lib/systemd/system
SYSUSERS_DIR ?= $(PREFIX)/lib/sysusers.d
LIBDIR  ?= $(PREFIX)/lib
# INSTALL_PYTHON=0: make install leaves out the Python package (an image
# without python3, such as docker/Dockerfile's)
INSTALL_PYTHON ?= 1
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
LDCONFIG ?= ldconfig
SAN     ?= 0
CC      ?= cc

ifeq ($(SAN),1)
BUILD   ?= build-san
OPT     ?= -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
SANLD   := -fsanitize=address,undefined
else ifeq ($(SAN),tsan)
BUILD   ?= build-tsan
OPT     ?= -O1 -fno-omit-frame-pointer -fsanitize=thread
SANLD   := -fsanitize=thread
else
BUILD   ?= build
OPT     ?= -O2
SANLD   :=
endif

# Debian packages, by what needs them. Each deps target installs the
# missing ones of its list, with apt-get --no-install-recommends (as root,
# else through sudo; APT_GET and SUDO are for tests):
#   make deps-build   DEB_BUILD_PACKAGES: `make all` (a compiler and the
#                     libraries' -dev packages; debian/control's Build-Depends)
#   make deps-wheel   and DEB_WHEEL_PACKAGES: make wheel, make install's
#                     Python step, virtualenvs
#   make deps-deb     debian/control's Build-Depends (apt-get satisfy): make deb
#   make deps         DEB_PACKAGES, everything make test and the demos use
#                     (cmocka, pytest, etcd-server and prometheus's promtool,
#                     torch...): make test, make demo and the like run it
DEB_BUILD_PACKAGES := build-essential pkg-config libevent-dev libinih-dev libssl-dev libxxhash-dev \
                libjson-c-dev libcurl4-openssl-dev librocksdb-dev libsystemd-dev librdmacm-dev \
                libibverbs-dev libzmq3-dev libmsgpack-dev
DEB_WHEEL_PACKAGES := python3-build python3-pip python3-setuptools python3-wheel python3-venv
DEB_PACKAGES := build-essential pkg-config libevent-dev libinih-dev libssl-dev openssl libxxhash-dev libcmocka-dev libjson-c-dev libcurl4-openssl-dev \
                librocksdb-dev libsystemd-dev prometheus python3-pytest python3-numpy \
                python3-torch python3-matplotlib libopenblas0-pthread \
                librdmacm-dev libibverbs-dev rdma-core etcd-server libzmq3-dev libmsgpack-dev python3-zmq \
                python3-msgpack python3-build python3-pip python3-setuptools python3-wheel python3-venv
PKGS    := libevent libevent_pthreads inih libssl libcrypto libxxhash cmocka json-c libcurl rocksdb libsystemd \
           libibverbs librdmacm libzmq msgpack

# The RDMA transport (rdma/): RDMA=1, the default when the rdma-core headers
# are installed, builds it and links libibverbs and librdmacm; RDMA=0 builds
# a stub whose calls answer -EOPNOTSUPP (kvpoold and libkvpool serve TCP).
# Object files differ between the two: give each its own BUILD directory.
ifeq ($(words $(wildcard /usr/include/infiniband/verbs.h /usr/include/rdma/rdma_cma.h)),2)
RDMA    ?= 1
else
RDMA    ?= 0
endif
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)

# The one version number: kvpoold's (server/srv_server.h), which the CLI
# prints too (kvpool --version).
VERSION := $(shell sed -n 's/^\#define SRV_VERSION "\(.*\)"/\1/p' server/srv_server.h)

CFLAGS  ?=
CFLAGS  += -DKVPOOL_VERSION='"$(VERSION)"'
CFLAGS  += -std=gnu11 -g $(OPT) -Wall -Wextra -Wpointer-arith -Werror -fPIC -D_GNU_SOURCE -pthread \
           -Iproto -Istorage -Iconfig -Iclient -Iserver -Irdma -Ietcd $(PKG_CFLAGS) -MMD -MP
LDFLAGS += $(SANLD) -pthread

LIBS_SERVER := -levent_core -levent_pthreads -levent_extra -linih -lxxhash -lrocksdb -lssl -lcrypto -lsystemd -lzmq \
               -lmsgpackc -lcurl -ljson-c -lm
LIBS_CLIENT := -lssl -lcrypto -lxxhash -lcurl -ljson-c -lm
LIBS_TEST   := -lcmocka
ifeq ($(RDMA),1)
CFLAGS      += -DKVPOOL_RDMA=1
LIBS_RDMA   := -lrdmacm -libverbs
RDMA_SRC    := $(filter-out rdma/rdmx_stub.c,$(wildcard rdma/*.c))
else
LIBS_RDMA   :=
RDMA_SRC    := rdma/rdmx_stub.c rdma/rdmx_desc.c
endif
LIBS_SERVER += $(LIBS_RDMA)
LIBS_CLIENT += $(LIBS_RDMA)

PROTO_SRC  := $(wildcard proto/*.c)
# storage/: the DRAM core and its NVMe wing make libstore.a (kvpoold's);
# storage/debug/ (the invariant checker, the test hooks) makes
# libstoretest.a, which only tests and benchmarks link.
STORE_SRC  := $(wildcard storage/*.c storage/nvme/*.c)
STORETEST_SRC := $(wildcard storage/debug/*.c)
CONF_SRC   := $(wildcard config/*.c)
# etcd/: the etcd v3 JSON-gateway client, shared like rdma/: kvpoold registers
# itself with it, libkvpool reads and watches the membership with it.
ETCD_SRC   := $(wildcard etcd/*.c)
SERVER_SRC := $(filter-out server/main.c,$(wildcard server/*.c)) $(ETCD_SRC) $(RDMA_SRC)
CLIENT_SRC := $(wildcard client/lib/*.c client/lib/*/*.c) $(ETCD_SRC) $(RDMA_SRC)
CLI_SRC    := $(wildcard client/cli/*.c)
UNIT_SRC   := $(wildcard tests/unit/test_*.c)
INTEG_SRC  := $(wildcard tests/integration/test_*.c)
INTEG_HELP := $(filter-out $(INTEG_SRC),$(wildcard tests/integration/*.c))

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
PROTO_OBJ  := $(call obj,$(PROTO_SRC))
STORE_OBJ  := $(call obj,$(STORE_SRC))
STORETEST_OBJ := $(call obj,$(STORETEST_SRC))
CONF_OBJ   := $(call obj,$(CONF_SRC))
SERVER_OBJ := $(call obj,$(SERVER_SRC))
CLIENT_OBJ := $(call obj,$(CLIENT_SRC))
CLI_OBJ    := $(call obj,$(CLI_SRC))
INTEG_HOBJ := $(call obj,$(INTEG_HELP))

KVPOOLD   := $(BUILD)/kvpoold
KVPOOL    := $(BUILD)/kvpool
LIB_A     := $(BUILD)/libkvpool.a
LIB_SO    := $(BUILD)/libkvpool.so
# The library's ABI version (SONAME libkvpool.so.N, Debian package
# libkvpoolN). Raise it with every change that an already built program
# would misread: a public struct that grows (kvpool_options gained its TLS
# fields, kvpool_put_block retain_ms, kvpool_limits the v2 limits: 1),
# a removed or retyped function. tests/abi/soname_test.sh checks that a program
# built against the old library is refused by the loader, not run.
SOVERSION := 1
UNIT_BIN  := $(patsubst tests/unit/test_%.c,$(BUILD)/tests/unit_%,$(UNIT_SRC))
INTEG_BIN := $(patsubst tests/integration/test_%.c,$(BUILD)/tests/integ_%,$(INTEG_SRC))

# The wheel of make wheel (the Packaging section), defined here because make
# install names it as a prerequisite: with libkvpool.so inside (WHEEL_LIB)
# it is for this platform, without (WHEEL_LIB=) pure.
DIST      := $(BUILD)/dist
WHEEL_LIB ?= $(LIB_SO)
WHEEL_PLATFORM := $(if $(WHEEL_LIB),$(shell $(PYTHON) -c 'import sysconfig; \
	print(sysconfig.get_platform().replace("-", "_").replace(".", "_"))' 2>/dev/null))
WHEEL_FILE := $(DIST)/kvpool-$(VERSION)-py3-none-$(if $(WHEEL_LIB),$(WHEEL_PLATFORM),any).whl

.PHONY: all deps deps-build deps-wheel deps-deb uninstall test test-san test-valgrind test-unit test-integration demo demo-nvme demo-ttft demo-pd install clean \
	nvme-bench bench fuzz fuzz-seeds soak container-test test-tsan test-engines-real
all: $(KVPOOLD) $(LIB_A) $(LIB_SO) $(KVPOOL)

# Install missing Debian packages (needs root or sudo). A no-op when all
# are present. DEPS_FORCE=1 installs without looking (tests of the lists).
APT_GET ?= apt-get
SUDO    ?= $(if $(filter 0,$(shell id -u)),,sudo)
DEPS_FORCE ?=
# $(1): what for, $(2): the apt-get command after "apt-get" (install PACKAGES, satisfy DEPENDS)
define apt_get
echo 'installing $(1): $(2)'; \
$(SUDO) $(APT_GET) update -qq && \
$(SUDO) env DEBIAN_FRONTEND=noninteractive $(APT_GET) $(2)
endef
APT_INSTALL := install -y -qq --no-install-recommends
BUILD_PKGS  := $(filter-out cmocka,$(PKGS))
deps-build:
	@if [ -n "$(DEPS_FORCE)" ] || ! pkg-config --exists $(BUILD_PKGS) 2>/dev/null || \
	    ! command -v cc >/dev/null; then \
	  $(call apt_get,build dependencies,$(APT_INSTALL) $(DEB_BUILD_PACKAGES)); \
	fi

deps-wheel: deps-build
	@if [ -n "$(DEPS_FORCE)" ] || ! $(PYTHON) -c 'import build, setuptools, wheel, pip, ensurepip' 2>/dev/null; then \
	  $(call apt_get,Python packaging tools,$(APT_INSTALL) $(DEB_WHEEL_PACKAGES)); \
	fi

# debian/control's Build-Depends, and build-essential, which dpkg-buildpackage assumes.
DEB_BUILD_DEPENDS = build-essential,$(shell awk '/^Build-Depends:/ { f = 1; sub(/^Build-Depends:/, ""); print; next } \
	f && /^[ \t]/ { print; next } { f = 0 }' debian/control | tr -d '\n' | sed 's/,[[:space:]]*$$//; s/[[:space:]][[:space:]]*/ /g')
deps-deb:
	@if [ -n "$(DEPS_FORCE)" ] || ! command -v dpkg-checkbuilddeps >/dev/null || \
	    ! dpkg-checkbuilddeps >/dev/null 2>&1; then \
	  $(call apt_get,the Build-Depends of debian/control,satisfy -y -qq --no-install-recommends "$(DEB_BUILD_DEPENDS)"); \
	fi

deps:
	@if [ -n "$(DEPS_FORCE)" ] || ! pkg-config --exists $(PKGS) 2>/dev/null || ! command -v cc >/dev/null || \
	    ! $(PYTHON) -c 'import pytest, numpy, zmq, msgpack, torch, matplotlib, build, pip, wheel, ensurepip' 2>/dev/null || \
	    ! ls /usr/lib/*/openblas-pthread/libblas.so.3 >/dev/null 2>&1 || ! command -v promtool >/dev/null || \
	    ! command -v etcd >/dev/null || ! command -v openssl >/dev/null; then \
	  $(call apt_get,build and test dependencies,$(APT_INSTALL) $(DEB_PACKAGES)); \
	fi

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/libproto.a: $(PROTO_OBJ)
$(BUILD)/libstore.a: $(STORE_OBJ)
$(BUILD)/libstoretest.a: $(STORETEST_OBJ)
$(BUILD)/libconf.a: $(CONF_OBJ)
$(BUILD)/libserver.a: $(SERVER_OBJ)
$(BUILD)/libproto.a $(BUILD)/libstore.a $(BUILD)/libstoretest.a $(BUILD)/libconf.a $(BUILD)/libserver.a:
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(KVPOOLD): $(call obj,server/main.c) $(BUILD)/libserver.a $(BUILD)/libstore.a $(BUILD)/libconf.a $(BUILD)/libproto.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_SERVER)

$(LIB_A): $(CLIENT_OBJ) $(PROTO_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(LIB_SO): $(CLIENT_OBJ) $(PROTO_OBJ) client/libkvpool.map Makefile
	$(CC) $(LDFLAGS) -shared -Wl,-soname,libkvpool.so.$(SOVERSION) -Wl,--version-script=client/libkvpool.map \
	  -o $@ $(CLIENT_OBJ) $(PROTO_OBJ) $(LIBS_CLIENT)
	ln -sf libkvpool.so $(BUILD)/libkvpool.so.$(SOVERSION)

$(KVPOOL): $(CLI_OBJ) $(LIB_A)
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_CLIENT) -ljson-c

# Unit tests link only their module and what it depends on.
.SECONDEXPANSION:
UNIT_DEPS_proto  := $(BUILD)/libproto.a
STORETEST_LIBS  := $(BUILD)/libstoretest.a $(BUILD)/libstore.a
UNIT_DEPS_store  := $(STORETEST_LIBS)
UNIT_DEPS_arena  := $(BUILD)/libstore.a
UNIT_DEPS_tier   := $(STORETEST_LIBS)
UNIT_DEPS_tier_durable := $(STORETEST_LIBS)
UNIT_DEPS_retain := $(STORETEST_LIBS)
UNIT_DEPS_index  := $(BUILD)/libstore.a
UNIT_DEPS_config := $(BUILD)/libconf.a
UNIT_FAKE_VERBS  := $(if $(filter 1,$(RDMA)),$(call obj,tests/unit/fake_verbs.c))
UNIT_DEPS_rdma   := $(call obj,$(RDMA_SRC)) $(UNIT_FAKE_VERBS) $(BUILD)/libproto.a
UNIT_DEPS_hash   := $(LIB_A)
UNIT_LIBS_hash   := -ljson-c
UNIT_DEPS_hrw    := $(LIB_A)
UNIT_LIBS_hrw    := -ljson-c
UNIT_DEPS_cluster_hot := $(call obj,client/lib/cluster/hot.c)
UNIT_DEPS_cluster_placement := $(LIB_A)
UNIT_LIBS_cluster_placement := -ljson-c
UNIT_FAKE        := $(call obj,tests/unit/fake_server.c)
UNIT_DEPS_client := $(UNIT_FAKE) $(LIB_A)
UNIT_DEPS_async  := $(UNIT_FAKE) $(LIB_A)
UNIT_DEPS_client_rdma := $(call obj,tests/unit/fake_rdma_server.c) $(UNIT_FAKE_VERBS) $(UNIT_FAKE) $(LIB_A)
UNIT_DEPS_server := $(BUILD)/libserver.a $(BUILD)/libstore.a $(BUILD)/libconf.a $(BUILD)/libproto.a
UNIT_LIBS_server := $(LIBS_SERVER)
UNIT_DEPS_auth   := $(UNIT_DEPS_server)
UNIT_LIBS_auth   := $(LIBS_SERVER)
UNIT_DEPS_memlimit := $(UNIT_DEPS_server)
UNIT_LIBS_memlimit := $(LIBS_SERVER)
# kvpoold's pure parts, one test program per subject (test_srv_<subject>.c).
UNIT_SRV_PURE := srv_log srv_conn srv_stats srv_fdlimit srv_out srv_etcd
$(foreach t,$(UNIT_SRV_PURE),$(eval UNIT_DEPS_$(t) := $(UNIT_DEPS_server))$(eval UNIT_LIBS_$(t) := $(LIBS_SERVER)))
UNIT_DEPS_admin  := $(UNIT_DEPS_server)
UNIT_DEPS_events := $(BUILD)/libserver.a $(STORETEST_LIBS) $(BUILD)/libconf.a $(BUILD)/libproto.a
UNIT_LIBS_admin  := $(LIBS_SERVER)
# kvpoold in process over the loopback fake fabric (test_srv_rdma.c).
UNIT_DEPS_srv_rdma := $(UNIT_FAKE_VERBS) $(UNIT_DEPS_server)
UNIT_LIBS_srv_rdma := $(LIBS_SERVER)
# libkvpool against that kvpoold over the same fake fabric (test_rdma_e2e.c).
UNIT_DEPS_rdma_e2e := $(UNIT_FAKE_VERBS) $(LIB_A) $(UNIT_DEPS_server)
UNIT_LIBS_rdma_e2e := $(LIBS_SERVER)
UNIT_DEPS_cli    := $(filter-out $(call obj,client/cli/main.c),$(CLI_OBJ)) $(UNIT_FAKE) $(LIB_A)
UNIT_LIBS_cli    := -ljson-c
UNIT_DEPS_nvme_io    := $(call obj,storage/nvme/nvme_io.c)
UNIT_LIBS_nvme_io    := -Wl,--wrap=openat,--wrap=pwritev,--wrap=pread
UNIT_DEPS_nvme_index := $(call obj,storage/nvme/nvme_index.c)
# Fault injection: storage/'s allocations, thread creation, RocksDB calls and
# segment I/O go through the test's __wrap_ functions (test_store_faults.c).
UNIT_DEPS_store_faults := $(STORETEST_LIBS)
UNIT_LIBS_store_faults := -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=posix_memalign \
	-Wl,--wrap=mmap,--wrap=strdup,--wrap=pthread_create \
	-Wl,--wrap=rocksdb_open,--wrap=rocksdb_write,--wrap=rocksdb_delete,--wrap=rocksdb_get \
	-Wl,--wrap=rocksdb_create_iterator,--wrap=rocksdb_iter_get_error \
	-Wl,--wrap=rocksdb_writebatch_create,--wrap=rocksdb_options_create \
	-Wl,--wrap=rocksdb_writeoptions_create,--wrap=rocksdb_readoptions_create \
	-Wl,--wrap=store_nvme_io_writev,--wrap=store_nvme_io_read
# Objects a test links before its libraries: the storage tests' shared
# keys, pools and scratch directories (tests/unit/store_fixture.c).
STORE_FIXTURE := $(call obj,tests/unit/store_fixture.c)
UNIT_PRE_store        := $(STORE_FIXTURE)
UNIT_PRE_tier         := $(STORE_FIXTURE)
UNIT_PRE_store_faults := $(STORE_FIXTURE)
UNIT_PRE_events       := $(STORE_FIXTURE)
UNIT_PRE_tier_durable := $(STORE_FIXTURE)
UNIT_PRE_retain       := $(STORE_FIXTURE)
$(BUILD)/tests/unit_%: $(call obj,tests/unit/test_%.c) $$(UNIT_PRE_$$*) $$(UNIT_DEPS_$$*)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(UNIT_LIBS_$*) $(LIBS_CLIENT) $(LIBS_SERVER) $(LIBS_TEST)

$(BUILD)/tests/integ_%: $(call obj,tests/integration/test_%.c) $(INTEG_HOBJ) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_CLIENT) $(LIBS_TEST) -ljson-c -lssl

# Benchmarks (tests/bench/): the wire limit, the index size, and the copy
# counter preloaded into kvpoold by test_copycount. The counter is built
# without sanitizers: it replaces memcpy in another program.
BENCH_WIRE  := $(BUILD)/tests/wire
BENCH_INDEX := $(BUILD)/tests/index_bytes
BENCH_TLS   := $(BUILD)/tests/tls_bench
BENCH_RETAIN := $(BUILD)/tests/retain_mix
BENCH_MWAIT := $(BUILD)/tests/match_wait
COPYCOUNT   := $(BUILD)/tests/libcopycount.so
ROFS        := $(BUILD)/tests/librofs.so
bench: all $(BENCH_WIRE) $(BENCH_INDEX) $(BENCH_RETAIN) $(BENCH_MWAIT) $(BENCH_TLS) $(COPYCOUNT)

# 1 MiB PUT and GET over TLS against plaintext, one kvpoold (tests/bench/tls.sh).
$(BENCH_TLS): $(call obj,tests/bench/tls_bench.c) $(BUILD)/libproto.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ -lssl -lcrypto -lxxhash

$(BENCH_WIRE): tests/bench/wire.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $<

# Wake-up latency of waiting MATCHes (tests/bench/match_wait.sh runs it).
$(BENCH_MWAIT): $(call obj,tests/bench/match_wait.c) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_CLIENT)

$(BENCH_INDEX): $(call obj,tests/bench/index_bytes.c) $(STORETEST_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_SERVER)

# Retention's target: system prompts beside a scan (tests/bench/retain_mix.c).
$(BENCH_RETAIN): $(call obj,tests/bench/retain_mix.c) $(BUILD)/libstore.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_SERVER)

$(COPYCOUNT): tests/bench/copycount.c
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -Werror -fPIC -shared -o $@ $< -ldl

# The read-only-filesystem fault shim preloaded into kvpoold by
# test_nvme_crash (no sanitizers either).
$(ROFS): tests/bench/rofs.c
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -Werror -fPIC -shared -o $@ $< -ldl

# Fuzz targets (tests/fuzz/fuzz_<target>.c). make test replays their
# stored inputs through a driver built like the other tests
# ($(BUILD)/tests/fuzz_<target>); make fuzz builds them with clang and
# libFuzzer into $(BUILD)/fuzz/, objects apart from the gcc ones.
FUZZ_TARGETS := frame config trace auth tls
FUZZ_REPLAY  := $(patsubst %,$(BUILD)/tests/fuzz_%,$(FUZZ_TARGETS))
FUZZ_DEPS_frame  := proto/proto.c
FUZZ_DEPS_config := $(CONF_SRC)
FUZZ_DEPS_trace  := client/cli/trace.c
FUZZ_DEPS_auth   := server/srv_auth.c server/srv_log.c $(CONF_SRC)
FUZZ_DEPS_tls    := server/srv_tls.c
FUZZ_LIBS := -linih -ljson-c -lssl -lcrypto

# A static pattern: a free one would let make chain it into the .d files.
$(patsubst %,$(BUILD)/obj/tests/fuzz/replay_%.o,$(FUZZ_TARGETS)): $(BUILD)/obj/tests/fuzz/replay_%.o: \
		tests/fuzz/replay.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DFUZZ_TARGET='"$*"' -c $< -o $@

$(BUILD)/tests/fuzz_%: $(BUILD)/obj/tests/fuzz/replay_%.o $(call obj,tests/fuzz/fuzz_%.c) \
		       $$(call obj,$$(FUZZ_DEPS_$$*))
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(FUZZ_LIBS) $(LIBS_TEST)

FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_CFLAGS   = -std=gnu11 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer-no-link $(FUZZ_SAN) \
		-Wall -Wextra -Werror -D_GNU_SOURCE -pthread -Iproto -Iconfig -Iclient -Iserver \
		$(PKG_CFLAGS) -MMD -MP
fuzz_obj = $(patsubst %.c,$(BUILD)/fuzz/obj/%.o,$(1))
FUZZ_BIN := $(patsubst %,$(BUILD)/fuzz/fuzz_%,$(FUZZ_TARGETS))

$(BUILD)/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@

$(BUILD)/fuzz/fuzz_%: $(call fuzz_obj,tests/fuzz/fuzz_%.c) $$(call fuzz_obj,$$(FUZZ_DEPS_$$*))
	$(FUZZ_CC) -fsanitize=fuzzer $(FUZZ_SAN) -o $@ $^ $(FUZZ_LIBS)

fuzz:
	@command -v $(FUZZ_CC) >/dev/null || { echo "make fuzz needs clang and libFuzzer" \
	  "(apt-get install clang libclang-rt-14-dev)"; exit 1; }
	@$(MAKE) --no-print-directory $(FUZZ_BIN)
	@tests/fuzz/run.sh $(BUILD)/fuzz $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# Rewrite the frame seeds from proto/'s own encoder (after a protocol change).
fuzz-seeds: $(BUILD)/tests/frame_seeds
	$(BUILD)/tests/frame_seeds tests/fuzz/corpus/frame

$(BUILD)/tests/frame_seeds: $(call obj,tests/fuzz/frame_seeds.c) $(BUILD)/libproto.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^

# Soaks (tests/soak/soak_<name>.c): long runs on the integration harness.
SOAK_SRC := $(wildcard tests/soak/soak_*.c)
SOAK_BIN := $(patsubst tests/soak/soak_%.c,$(BUILD)/tests/soak_%,$(SOAK_SRC))
SOAK_SECONDS ?= 600
TEST_SOAK_SECONDS ?= 30

$(BUILD)/tests/soak_%: $(call obj,tests/soak/soak_%.c) $(INTEG_HOBJ) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_CLIENT) $(LIBS_TEST) -ljson-c

soak: deps
	@$(MAKE) --no-print-directory all $(SOAK_BIN)
	@for s in $(SOAK_BIN); do KVPOOLD=$(CURDIR)/$(KVPOOLD) $$s --seconds $(SOAK_SECONDS) || exit 1; done

# The Python binding's pytest suite runs as one more test program (in a
# sanitizer build, with the sanitizer runtimes preloaded into python3).
PY_TESTS := tests/python/pytest.sh
# The layering check's own tests: a forbidden include in a scratch copy fails.
DEPS_TESTS := tests/deps_check_test.sh
# README.md's shell, C and Python blocks, run against a scratch kvpoold
# (markers and substitutions: the head of tests/readme_test.sh).
README_TEST := tests/readme_test.sh
# The SONAME guards programs built against an older struct layout.
ABI_TEST := tests/abi/soname_test.sh

# The layering rules (tests/deps_rules.txt): which folder may #include which.
.PHONY: deps-check
deps-check:
	@tests/deps_check.sh

test: deps deps-check
	@$(MAKE) --no-print-directory all $(UNIT_BIN) $(INTEG_BIN) $(FUZZ_REPLAY) $(SOAK_BIN) $(COPYCOUNT) $(ROFS)
	@BUILD=$(BUILD) KVPOOL_SOAK_SECONDS=$(TEST_SOAK_SECONDS) \
	  tests/run.sh $(UNIT_BIN) $(INTEG_BIN) $(FUZZ_REPLAY) $(SOAK_BIN) $(PY_TESTS) $(DEPS_TESTS) $(README_TEST) $(ABI_TEST)
	@# (not in the sanitizer build: ThreadSanitizer and AddressSanitizer do not mix)
	@if [ "$(SAN)" = 0 ]; then $(MAKE) --no-print-directory test-tsan; fi

# The engine adapters inside vLLM's, SGLang's and LMCache's own code, from
# source snapshots named by KVPOOL_VLLM_SRC (the folder with vllm/),
# KVPOOL_SGLANG_SRC (the checkout, or its python/ folder) and
# KVPOOL_LMCACHE_SRC (the folder with lmcache/); not part of make test (CI
# has no snapshots); skips with one line when none is set.
test-engines-real: all
	@BUILD=$(BUILD) tests/engines_real/run.sh

# The integration tests with kvpoold under valgrind: a leak or memory error
# makes the daemon exit 99, which fails the test's clean-shutdown check.
test-valgrind: deps
	@command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)"; exit 1; }
	@$(MAKE) --no-print-directory all $(INTEG_BIN) $(COPYCOUNT) $(ROFS)
	@KVPOOL_VALGRIND=1 BUILD=$(BUILD) tests/run.sh $(INTEG_BIN)

test-san: deps
	@$(MAKE) --no-print-directory SAN=1 test

# ThreadSanitizer over libkvpool's request engine and cluster backend:
# tests/integration/test_async.c (its test_threads has three threads
# submitting, a fourth polling and two more making blocking calls on one
# handle) and test_cluster_async.c (node threads; sync and async calls from
# several threads on one cluster handle), built with -fsanitize=thread
# against an uninstrumented kvpoold; a reported race fails it (exit code 66).
TSAN_BUILD ?= $(BUILD)-tsan
TSAN_TESTS := integ_async integ_cluster_async
test-tsan: deps
	@$(MAKE) --no-print-directory $(KVPOOLD)
	@$(MAKE) --no-print-directory SAN=tsan BUILD=$(TSAN_BUILD) $(patsubst %,$(TSAN_BUILD)/tests/%,$(TSAN_TESTS))
	@for t in $(TSAN_TESTS); do \
	  KVPOOLD=$(CURDIR)/$(KVPOOLD) TSAN_OPTIONS="halt_on_error=1 exitcode=66 $(TSAN_OPTIONS)" \
	    $(TSAN_BUILD)/tests/$$t || exit 1; done

# The NVMe tier benchmark binary (tests/bench/nvme_tier.sh runs it; not in make test).
NVME_BENCH := $(BUILD)/tests/nvme_bench
$(NVME_BENCH): $(call obj,tests/bench/nvme_bench.c) $(STORETEST_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS_SERVER)
nvme-bench: $(NVME_BENCH)

demo: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) tests/demo.sh

# The image, built and started the way tests/container/run.sh describes;
# skips (fails under CI=true) without root, buildah, podman or debootstrap.
container-test: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) tests/container/run.sh

demo-nvme: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) tests/demo_nvme.sh

# The prefill -> decode hand-off demo (examples/pd, docs/pd.md): a router,
# a prefill node and a decode node on the TTFT demo's decoder; the report
# and the picture go to $(BUILD)/pd.
demo-pd: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) examples/pd/run.sh

# The TTFT demo (examples/ttft, described in docs/ttft.md): python3-torch and
# python3-matplotlib come from deps; the report goes to $(BUILD)/ttft.
demo-ttft: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) examples/ttft/run.sh

install: all $(if $(filter 1,$(INSTALL_PYTHON)),$(WHEEL_FILE))
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) \
	  $(DESTDIR)$(PREFIX)/share/kvpool $(DESTDIR)$(PKGCONFIGDIR)
	install -m 755 $(KVPOOLD) $(KVPOOL) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(LIB_A) $(DESTDIR)$(LIBDIR)/
	install -m 755 $(LIB_SO) $(DESTDIR)$(LIBDIR)/libkvpool.so.$(SOVERSION)
	ln -sf libkvpool.so.$(SOVERSION) $(DESTDIR)$(LIBDIR)/libkvpool.so
	install -m 644 client/kvpool.h $(DESTDIR)$(INCLUDEDIR)/
	$(call kvpool_pc) > $(DESTDIR)$(PKGCONFIGDIR)/kvpool.pc
	install -m 644 config/kvpool.conf $(DESTDIR)$(PREFIX)/share/kvpool/
	@# the Python package: the wheel of make wheel, installed by pip with its
	@# metadata (the vllm.general_plugins entry point, RECORD for pip uninstall)
	$(if $(filter 1,$(INSTALL_PYTHON)),$(call pip_install_wheel,$(DESTDIR)$(PYDIR)))
	install -d $(DESTDIR)$(SYSTEMD_UNIT_DIR) $(DESTDIR)$(SYSUSERS_DIR) $(DESTDIR)$(SYSCONFDIR)/kvpool
	sed -e 's|/usr/local/bin/kvpoold|$(PREFIX)/bin/kvpoold|' -e 's|/etc/kvpool/|$(SYSCONFDIR)/kvpool/|' \
	  config/kvpoold.service > $(DESTDIR)$(SYSTEMD_UNIT_DIR)/kvpoold.service
	chmod 644 $(DESTDIR)$(SYSTEMD_UNIT_DIR)/kvpoold.service
	install -m 644 config/kvpool.sysusers $(DESTDIR)$(SYSUSERS_DIR)/kvpool.conf
	@# an operator's configuration is never overwritten
	[ -e $(DESTDIR)$(SYSCONFDIR)/kvpool/kvpool.conf ] || \
	  install -m 644 config/kvpool.conf $(DESTDIR)$(SYSCONFDIR)/kvpool/kvpool.conf
	@# the dynamic linker's cache, so that programs find libkvpool.so.$(SOVERSION) at once
	@# (not for a staged DESTDIR install: the package's own scripts do it)
	@if [ -z "$(DESTDIR)" ]; then \
	  if [ "$$(id -u)" = 0 ]; then $(LDCONFIG) || echo "make install: $(LDCONFIG) failed"; \
	  else echo "make install: run '$(LDCONFIG)' as root so that libkvpool.so.$(SOVERSION) is found"; fi; \
	fi

# What make install put there, with the same variables; the configuration
# in SYSCONFDIR/kvpool stays (as apt-get remove leaves it), and so do the
# kvpool user and /var/lib/kvpool. The Python package goes by the RECORD
# pip wrote: Debian's pip will not uninstall from its own python3's
# directories without --break-system-packages.
uninstall:
	@if [ -z "$(DESTDIR)" ] && [ -e /etc/systemd/system/multi-user.target.wants/kvpoold.service ]; then \
	  echo "make uninstall: kvpoold.service is enabled: run 'systemctl disable --now kvpoold' first"; exit 1; fi
	rm -f $(DESTDIR)$(PREFIX)/bin/kvpoold $(DESTDIR)$(PREFIX)/bin/kvpool
	rm -f $(DESTDIR)$(LIBDIR)/libkvpool.a $(DESTDIR)$(LIBDIR)/libkvpool.so.$(SOVERSION) $(DESTDIR)$(LIBDIR)/libkvpool.so
	rm -f $(DESTDIR)$(INCLUDEDIR)/kvpool.h $(DESTDIR)$(PKGCONFIGDIR)/kvpool.pc
	rm -f $(DESTDIR)$(PREFIX)/share/kvpool/kvpool.conf
	-rmdir $(DESTDIR)$(PREFIX)/share/kvpool 2>/dev/null
	rm -f $(DESTDIR)$(SYSTEMD_UNIT_DIR)/kvpoold.service $(DESTDIR)$(SYSUSERS_DIR)/kvpool.conf
	@# the directories make install may have made for them, only if now empty
	-@rmdir $(DESTDIR)$(PKGCONFIGDIR) $(DESTDIR)$(SYSTEMD_UNIT_DIR) $(DESTDIR)$(dir $(SYSTEMD_UNIT_DIR)) \
	  $(DESTDIR)$(SYSUSERS_DIR) 2>/dev/null
	@for r in $(DESTDIR)$(PYDIR)/kvpool-*.dist-info/RECORD; do \
	  [ -f "$$r" ] || continue; d=$${r%/kvpool-*}; echo "removing the Python package in $$d ($$r)"; \
	  cut -d, -f1 "$$r" | grep -E '^kvpool(/|-[^/]*\.dist-info/)' | while read -r f; do rm -f "$$d/$$f"; done; \
	  rm -rf "$$d"/kvpool/__pycache__ "$$d"/kvpool/*/__pycache__ "$$d"/kvpool/*/*/__pycache__; \
	  find "$$d/kvpool" "$${r%/RECORD}" -depth -type d -empty -delete 2>/dev/null; \
	done; true
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ]; then $(LDCONFIG) || true; fi
	@echo "make uninstall: kept $(DESTDIR)$(SYSCONFDIR)/kvpool (the configuration); the kvpool user and /var/lib/kvpool stay too"

# ---- Packaging ---------------------------------------------------------------
# How kvpool is installed outside the build tree (docs/building.md, Packages):
#   make wheel           $(BUILD)/dist/kvpool-VERSION-py3-none-PLATFORM.whl: the Python
#                        package (client/python/pyproject.toml) with libkvpool.so inside;
#                        WHEEL_LIB= makes a pure wheel that loads the system's libkvpool.so.1
#   make install         (above) the binaries, the library, kvpool.h, kvpool.pc, the wheel
#                        through pip, the unit, the sysusers entry, /etc/kvpool/kvpool.conf
#   make deb             dpkg-buildpackage -b -us -uc on a copy of the tracked files:
#                        kvpool, kvpool-tools, libkvpool1, libkvpool-dev and python3-kvpool
#                        in $(BUILD)/deb/
#   make test-packaging  installs the tools below, then tests/packaging/run.sh: what each
#                        deps target installs, the wheel in a fresh virtualenv, pkg-config on
#                        a staged install and make uninstall, the Debian packages (contents,
#                        lintian, an install and purge in a Debian 12 root), the Kubernetes
#                        manifests of deploy/kubernetes against kvpoold
DEB_OUT   := $(BUILD)/deb
# What make test-packaging needs besides debian/control's Build-Depends
# (make deps-deb) and the wheel's tools (make deps-wheel): lintian, PyYAML
# for the manifest check, Debian's etcd that it starts, debootstrap for the
# Debian 12 root the packages are installed into; kubectl, when none is
# installed, comes from Debian's kubernetes-client.
PACKAGING_DEB_PACKAGES := lintian python3-yaml etcd-server debootstrap
.PHONY: wheel deb deb-src test-packaging deps-packaging

# setuptools works in $(BUILD)/python, never in the source tree; the version
# comes from server/srv_server.h (client/python/setup.py). The wheel is a
# file target: once built, make install (sudo make install, too) uses it as
# it is. The library goes in stripped (strip --strip-unneeded, as dh_strip
# does; the debug information stays in $(WHEEL_LIB)).
STRIP ?= strip
PY_SOURCES := client/python/setup.py client/python/pyproject.toml $(shell find client/python/kvpool -name '*.py')

wheel: deps-wheel
	@$(MAKE) --no-print-directory $(WHEEL_FILE)
	@ls $(WHEEL_FILE)

$(WHEEL_FILE): $(if $(WHEEL_LIB),$(WHEEL_LIB)) $(PY_SOURCES) server/srv_server.h
	@$(PYTHON) -c 'import build, setuptools, wheel' 2>/dev/null || { echo "make wheel needs" \
	  "python3-build, python3-setuptools and python3-wheel (make deps-wheel)"; exit 1; }
	@rm -rf $(BUILD)/python $(DIST)/kvpool-*.whl && mkdir -p $(BUILD)/python $(DIST)
	$(if $(WHEEL_LIB),$(STRIP) --strip-unneeded -o $(BUILD)/python/libkvpool.so $(WHEEL_LIB))
	@KVPOOL_BUNDLE_LIB=$(if $(WHEEL_LIB),$(abspath $(BUILD)/python/libkvpool.so)) KVPOOL_PY_BUILD=$(abspath $(BUILD)/python) \
	  $(PYTHON) -m build --no-isolation --wheel --outdir $(DIST) client/python \
	  >$(BUILD)/python/build.log 2>&1 || { cat $(BUILD)/python/build.log; exit 1; }
	@test -f $@ || { echo "make wheel: setuptools wrote $$(ls $(DIST)), not $@"; exit 1; }

# pip install of the wheel into one directory (make install's Python step):
# --target keeps pip off the system's own packages (and Debian's
# EXTERNALLY-MANAGED guard off a staged DESTDIR); --upgrade replaces an
# older kvpool there, hand-written dist-info of older make installs included.
define pip_install_wheel
rm -rf $(1)/kvpool-*.dist-info
$(PYTHON) -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
  --no-index --no-deps --no-compile --upgrade --target $(1) $(WHEEL_FILE)
endef

# kvpool.pc for make install: paths relative to ${prefix} where they can be,
# so that PKG_CONFIG_SYSROOT_DIR works on a staged tree; Libs.private lists
# what the static library needs (pkg-config --static).
define kvpool_pc
printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(patsubst $(PREFIX)/%,$${prefix}/%,$(LIBDIR))' \
  'includedir=$(patsubst $(PREFIX)/%,$${prefix}/%,$(INCLUDEDIR))' '' 'Name: kvpool' \
  'Description: client library of the kvpool KV-cache pool' 'URL: https://github.com/kvpool/kvpool' \
  'Version: $(VERSION)' 'Cflags: -I$${includedir}' 'Libs: -L$${libdir} -lkvpool' \
  'Libs.private: $(LIBS_CLIENT) -pthread'
endef

# dpkg-buildpackage writes its packages next to the tree it builds: it builds
# a copy of the tree in $(DEB_OUT)/src, so the packages land in $(DEB_OUT)
# and the build in $(DEB_OUT)/src/build. The copy has the files git tracks
# (as they are in the working tree: edits count; untracked files - a
# virtualenv, deploy/kubernetes/setup/tokens - never travel: git add a new
# source file first); outside a git checkout, everything but build dirs.
# debian/changelog's version must be SRV_VERSION.
deb: deps-deb
	@for t in dpkg-buildpackage dh dh_python3 help2man; do command -v $$t >/dev/null || { echo "make deb" \
	  "needs $$t: make deps-deb installs debian/control's Build-Depends"; exit 1; }; done
	@v=$$(dpkg-parsechangelog -l debian/changelog -SVersion); [ "$$v" = "$(VERSION)" ] || { \
	  echo "make deb: debian/changelog is at $$v, server/srv_server.h at $(VERSION):" \
	  "add a changelog entry (dch -v $(VERSION))"; exit 1; }
	@$(MAKE) --no-print-directory deb-src
	cd $(DEB_OUT)/src && dpkg-buildpackage -b -us -uc -J$$(nproc)
	@ls $(DEB_OUT)/*.deb

# The copy make deb builds, alone (make test-packaging checks what is in it).
deb-src:
	rm -rf $(DEB_OUT) && mkdir -p $(DEB_OUT)/src
	@if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
	  git ls-files -z --cached | tar --null --ignore-failed-read -T - -cf -; \
	else tar --exclude=./build --exclude='./build-*' --exclude=./.git -cf - .; fi | tar -C $(DEB_OUT)/src -xf -

deps-packaging: deps-deb deps-wheel
	@if [ -n "$(DEPS_FORCE)" ] || ! command -v lintian >/dev/null || ! command -v etcd >/dev/null || \
	    ! command -v debootstrap >/dev/null || ! $(PYTHON) -c 'import yaml' 2>/dev/null; then \
	  $(call apt_get,packaging test tools,$(APT_INSTALL) $(PACKAGING_DEB_PACKAGES)); \
	fi
	@if [ -n "$(DEPS_FORCE)" ] || ! command -v kubectl >/dev/null; then \
	  $(call apt_get,kubectl from kubernetes-client,$(APT_INSTALL) kubernetes-client); \
	fi

test-packaging: deps-packaging
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) PYTHON=$(PYTHON) tests/packaging/run.sh

# build/ and every top-level build-*/ directory (BUILD=build-<name> ones);
# a file called build-something is not a build directory and stays.
clean:
	rm -rf build $(wildcard build-*/)

-include $(shell find $(BUILD)/obj $(BUILD)/fuzz/obj -name '*.d' 2>/dev/null)
