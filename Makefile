# The two commands: `make run` and `make test`. Both install what is missing.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
CPY_VENV := .venv-cpython
CPY := $(CPY_VENV)/bin/python
LINT_VENV := .venv-lint
CLIENTS_VENV := .venv-clients
NODE_CLIENTS := tests/clients
NODE_IDENTITY := tests/identity/provider
VAR := $(CURDIR)/var
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := pypy3 pypy3-venv pypy3-dev redis-server python3-venv
REQUIREMENTS := requirements.txt requirements-nodeps.txt requirements-dev.txt
HOST ?= 127.0.0.1
PORT ?= 8080

.PHONY: setup setup-cpython setup-clients client-packages identity-packages browser-packages system-packages run private-redis stop-redis test lint clean

setup: $(VENV)/.installed

setup-cpython: $(CPY_VENV)/.installed

# Debian packages, installed only when a command is missing.
system-packages:
	@missing=""; \
	command -v pypy3 >/dev/null || missing="$$missing pypy3 pypy3-venv pypy3-dev"; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v supervisord >/dev/null || missing="$$missing supervisor"; \
	python3 -c 'import ensurepip' 2>/dev/null || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

# The PyPy environment the gateway runs in. cyclone goes in with --no-deps
# (its metadata pins a 2019 Twisted; see requirements-nodeps.txt).
$(VENV)/.installed: $(REQUIREMENTS) | system-packages
	pypy3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt -r requirements-dev.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
	touch $@

# The same code on CPython 3.11, for the compatibility test and comparisons.
$(CPY_VENV)/.installed: $(REQUIREMENTS) | system-packages
	python3 -m venv $(CPY_VENV)
	$(CPY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(CPY) -m pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
	touch $@

# Serve on $(HOST):$(PORT). Without REDIS_URL a private Redis is started on a
# unix socket under ./var/ (and left running for the next `make run`;
# `make stop-redis` ends it). Logs as text for a terminal unless
# JETWAY_LOG_FORMAT says otherwise (JSON is the default everywhere else). The
# master runs on CPython (.venv-cpython), its workers on PyPy: the master
# serves no request, and on CPython it is under half PyPy's size
# (api/master_python.py); JETWAY_MASTER_PYTHON= (empty) keeps it on PyPy.
run: setup setup-cpython
	@if [ -z "$$REDIS_URL" ]; then \
	  $(MAKE) --no-print-directory private-redis || exit 1; \
	  export REDIS_URL=unix://$(VAR)/redis.sock; \
	fi; \
	if [ "$${JETWAY_AUTH:-on}" != off ]; then \
	  token=$$($(PY) -m api keys rotate dev 2>/dev/null || $(PY) -m api keys create --name dev --scope admin 2>/dev/null) \
	    || { echo "cannot make a development token: is Redis at $$REDIS_URL up?"; exit 1; }; \
	  echo "development token (all scopes; a new one each run):"; \
	  echo "  curl -H 'Authorization: Bearer $$token' http://$(HOST):$(PORT)/v1/users/u1"; \
	fi; \
	JETWAY_MASTER_PYTHON=$${JETWAY_MASTER_PYTHON-$(CURDIR)/$(CPY)} \
	  JETWAY_LOG_FORMAT=$${JETWAY_LOG_FORMAT:-text} exec $(PY) -m api serve --host $(HOST) --port $(PORT)

# The private Redis: its files in $(VAR), and an append-only file written
# before each reply and fsynced every second, so a crash of Redis loses no
# acknowledged write and one of the machine at most a second of them. One
# already running from before gets the append-only file turned on live.
private-redis: system-packages
	@mkdir -p $(VAR); \
	if ! redis-cli -s $(VAR)/redis.sock ping >/dev/null 2>&1; then \
	  redis-server --port 0 --unixsocket $(VAR)/redis.sock --unixsocketperm 700 \
	    --dir $(VAR) --appendonly yes --appendfsync everysec \
	    --daemonize yes --pidfile $(VAR)/redis.pid --logfile $(VAR)/redis.log; \
	  for i in $$(seq 50); do redis-cli -s $(VAR)/redis.sock ping >/dev/null 2>&1 && break; sleep 0.1; done; \
	fi; \
	redis-cli -s $(VAR)/redis.sock config set appendonly yes >/dev/null || { echo "the private Redis does not answer"; exit 1; }; \
	for i in $$(seq 100); do \
	  redis-cli -s $(VAR)/redis.sock info persistence | grep -Eq '^aof_rewrite_(in_progress|scheduled):1' || break; sleep 0.1; \
	done; \
	echo "private Redis on unix:$(VAR)/redis.sock (append-only file in $(VAR))"

stop-redis:
	@if [ -f $(VAR)/redis.pid ]; then kill $$(cat $(VAR)/redis.pid) && echo "stopped the private Redis"; fi

# Linters for deploy/: cfn-lint needs Python 3.10+ (not the PyPy 3.9 .venv);
# shellcheck comes as a binary in a wheel.
$(LINT_VENV)/.installed: requirements-lint.txt | system-packages
	python3 -m venv $(LINT_VENV)
	$(LINT_VENV)/bin/python -m pip install -q --disable-pip-version-check -r requirements-lint.txt
	touch $@

lint: setup $(LINT_VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(LINT_VENV)/bin/shellcheck deploy/ec2/user-data.sh release/build.sh
	$(LINT_VENV)/bin/cfn-lint deploy/ec2/jetway.yaml

# Client generators for tests/process/test_generated_clients.py: openapi-python-client
# on CPython, and openapi-typescript, openapi-fetch and tsc from npm (the
# versions in tests/clients/package-lock.json).
setup-clients: $(CLIENTS_VENV)/.installed $(NODE_CLIENTS)/node_modules/.installed

# Node.js for the TypeScript client only (never on a server: `make setup` leaves it out).
client-packages: | system-packages
	@command -v npm >/dev/null || { \
	  echo "installing: nodejs npm"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq nodejs npm; \
	}

$(CLIENTS_VENV)/.installed: requirements-clients.txt | system-packages
	python3 -m venv $(CLIENTS_VENV)
	$(CLIENTS_VENV)/bin/python -m pip install -q --disable-pip-version-check -r requirements-clients.txt
	touch $@

$(NODE_CLIENTS)/node_modules/.installed: $(NODE_CLIENTS)/package.json $(NODE_CLIENTS)/package-lock.json | client-packages
	cd $(NODE_CLIENTS) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# The suite's OpenID Connect provider (tests/identity/oidc_provider.py): oidc-provider
# from npm, the version in tests/identity/provider/package-lock.json, on Debian's Node.
identity-packages: $(NODE_IDENTITY)/node_modules/.installed

$(NODE_IDENTITY)/node_modules/.installed: $(NODE_IDENTITY)/package.json $(NODE_IDENTITY)/package-lock.json | client-packages
	cd $(NODE_IDENTITY) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# Debian's chromium and chromedriver for the browser tests (tests/browser.py;
# selenium itself is in requirements-dev.txt). Never on a server: `make setup`
# leaves them out.
browser-packages: | system-packages
	@missing=""; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	[ -x /usr/bin/chromedriver ] || missing="$$missing chromium-driver"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

# On $(TEST_WORKERS) pytest-xdist workers, each file's tests on one worker
# (its module fixtures are started once); TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
ON_WORKERS = -n $(TEST_WORKERS) --dist loadfile
test: setup setup-cpython setup-clients identity-packages browser-packages lint
	$(PY) -m pytest $(ON_WORKERS)

clean:
	rm -rf $(VENV) $(CPY_VENV) $(LINT_VENV) $(CLIENTS_VENV) $(NODE_CLIENTS)/node_modules $(NODE_IDENTITY)/node_modules $(VAR) .pytest_cache

# --- Load testing: loadtest/, see docs/testing.md, "Load testing" ---------
LT_VENV := .venv-loadtest
LT_PY := $(LT_VENV)/bin/python

.PHONY: setup-loadtest loadtest-packages loadtest loadtest-check loadtest-record bench bench-quick clean-loadtest

# locust needs gevent on CPython: its own environment, never the PyPy one.
$(LT_VENV)/.installed: requirements-loadtest.txt | system-packages
	python3 -m venv $(LT_VENV)
	$(LT_PY) -m pip install -q --disable-pip-version-check -r requirements-loadtest.txt
	touch $@

setup-loadtest: $(LT_VENV)/.installed

# wrk (the bench's load generator) and nginx (its ceiling), for the bench only.
loadtest-packages: | system-packages
	@missing=""; \
	command -v wrk >/dev/null || missing="$$missing wrk"; \
	command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing="$$missing nginx-light"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

# A headless locust run against a Jetway started for it (private Redis);
# LOADTEST_USERS, _USER_RATE, _WARMUP, _DURATION, _WORKERS change the scenario.
loadtest: setup setup-loadtest
	$(LT_PY) -m loadtest._run run

# The baseline's scenario again; fails naming request and figure on a regression.
loadtest-check: setup setup-loadtest loadtest-packages
	$(LT_PY) -m loadtest._run check

loadtest-record: setup setup-loadtest
	$(LT_PY) -m loadtest._run record

# Side by side, interleaved: Jetway PyPy/CPython/1 worker, nginx, re-encoding.
# BENCH_WARMUP, _DURATION, _ROUNDS, _CONNECTIONS, _WORKERS, _PIN, _SERVERS, _ENDPOINTS, _RSS_SECONDS.
bench: setup setup-cpython setup-loadtest loadtest-packages
	$(LT_PY) -m loadtest.bench

# Seconds instead of minutes, to see that it works; the figures mean nothing.
bench-quick: setup setup-cpython setup-loadtest loadtest-packages
	$(LT_PY) -m loadtest.bench --quick

# The suite checks the load-test gate end to end (tests/loadtest/test_loadtest.py).
test: setup-loadtest

clean: clean-loadtest

clean-loadtest:
	rm -rf $(LT_VENV)

# --- The slow tests: marked `slow`, skipped by `make test` ----------------------
# Each runs over ten seconds on its own (the fuzzers, the load-test gate,
# reloads and restarts under load, the generated parsers' and indexes' checks),
# kept out of `make test`; README.md says how long each takes. CI runs it after `make test`.
# On $(TEST_WORKERS) workers as `make test`, but the load-test gate, which
# measures throughput against a baseline and so runs alone, after them.
.PHONY: test-slow
test-slow: setup setup-clients identity-packages setup-loadtest loadtest-packages
	JETWAY_TEST_SLOW=1 $(PY) -m pytest -rP -m slow $(ON_WORKERS) --ignore=tests/loadtest
	JETWAY_TEST_SLOW=1 $(PY) -m pytest -rP -m slow tests/loadtest

# --- Releases: what a server installs (docs/deploy.md) ------------------------
# One file per commit: the code and a wheelhouse of the runtime requirements
# for this machine's PyPy 3.9, with its sha256 beside it, in $(RELEASE_DIR).
# COMMIT=rev (default HEAD) and VERSION=label (default the short hash) choose.
RELEASE_DIR := $(VAR)/releases
.PHONY: release

release: setup setup-cpython
	release/build.sh --out $(RELEASE_DIR) $(if $(COMMIT),--commit $(COMMIT)) $(if $(VERSION),--version $(VERSION))

# --- The EC2 user data on a booted Debian: tests/deploy/test_deploy_boot.py --
# A bookworm root (debootstrap, cached in $(DEPLOY_BASE); `make clean` drops it)
# booted with systemd-nspawn, its user data run by cloud-init, installing two
# releases the test builds with release/build.sh. Needs root (as CI runs); the
# figures of a cold run are in docs/deploy.md. CI runs it after test-cluster.
DEPLOY_BASE := $(VAR)/deploy-base
.PHONY: test-deploy deploy-packages

deploy-packages: | system-packages
	@missing=""; \
	command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || missing="$$missing debootstrap"; \
	command -v systemd-nspawn >/dev/null || missing="$$missing systemd-container"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

$(DEPLOY_BASE)/.jetway-base-complete: | deploy-packages
	$(SUDO) env PATH="$$PATH:/usr/sbin:/sbin" tests/deploy/base_root.sh $(DEPLOY_BASE)

test-deploy: setup setup-cpython $(DEPLOY_BASE)/.jetway-base-complete
	$(SUDO) env JETWAY_TEST_DEPLOY=1 JETWAY_DEPLOY_BASE=$(DEPLOY_BASE) $(PY) -m pytest -rP tests/deploy/test_deploy_boot.py

# --- Multi-node Redis: tests/multinode.py, see docs/operations.md, "Scaling Redis"
# The API tests on a 3-master Redis Cluster and on a Sentinel group (1 master,
# 1 replica, 3 sentinels), slots resharded under load, a master killed under
# load, a TLS-only cluster, the change feed on a cluster and across a Sentinel
# failover. Under eight minutes here (2 cores); CI runs it after `make test`.
.PHONY: test-cluster
API_TESTS := tests/handlers/test_documents.py tests/handlers/test_collections.py tests/handlers/test_queries.py tests/handlers/test_multi_get.py tests/cache/test_response_budget.py tests/handlers/http/test_errors.py tests/handlers/http/test_auth.py tests/cache/test_hot_cache_api.py

test-cluster: setup
	JETWAY_TEST_TOPOLOGY=cluster $(PY) -m pytest -rP $(API_TESTS) tests/handlers/test_changes.py tests/handlers/test_live_queries.py tests/handlers/test_expiry.py tests/handlers/test_query_arrays.py tests/handlers/test_query_counts.py tests/handlers/test_count_expiry.py tests/handlers/test_batch_indexes.py tests/cache/redis/test_cluster.py tests/cache/redis/test_cluster_failover.py tests/cache/redis/test_sentinel.py tests/cache/redis/test_sentinel_switch.py tests/cache/redis/test_expiry_failover.py tests/cache/test_write_concern_failover.py tests/tracing/test_traces.py tests/tracing/test_feed_traces.py
	JETWAY_TEST_TOPOLOGY=sentinel $(PY) -m pytest $(filter-out tests/handlers/http/test_errors.py,$(API_TESTS))

# --- Consistency: tests/consistency/ (issue #56), see tests/consistency/README.md
# Concurrent clients' histories under each fault (a worker killed, SIGHUP,
# Redis killed and restarted on its AOF, Sentinel failovers with and without
# write concern, late invalidations), checked by Porcupine in a Go program of
# its own and the change feed against them. One history of each: 3-5 minutes
# here. The soak: CONSISTENCY_HISTORIES=20 CONSISTENCY_OPS=2000 make test-consistency.
# Go comes from Debian (golang-go, 1.19 on bookworm) only when there is none.
.PHONY: test-consistency go-packages
GO_PATHS := $(PATH):/usr/local/go/bin:/usr/lib/go/bin

go-packages: | system-packages
	@export PATH="$(GO_PATHS)"; command -v go >/dev/null || { \
	  echo "installing: golang-go"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq golang-go; \
	}

test-consistency: setup go-packages
	PATH="$(GO_PATHS)" JETWAY_TEST_CONSISTENCY=1 $(PY) -m pytest -rP tests/consistency
