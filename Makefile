# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# `make run` needs the server only (about 60 MB); `make test`, `lint`, `bench` and
# `demo-connect` need everything (the test and report extras, about 1.1 GB).
SERVER_STAMP := $(VENV)/.installed-server-stamp
STAMP := $(VENV)/.installed-stamp
# Passed to the command a target runs: `make run ARGS='--listen 127.0.0.1:29092'`.
ARGS ?=

.PHONY: install install-server run test lint bench system-deps interop-jars demo-connect

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall only when the project's dependencies change.
$(SERVER_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $(SERVER_STAMP)

# The full install holds the server's too.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP) $(SERVER_STAMP)

install-server: $(SERVER_STAMP)

install: $(STAMP)

run: install-server
	$(BIN)/connect-coordinator serve --data-dir ./data $(ARGS)

# Programs some tests run, from Debian packages: Prometheus and promtool (package
# `prometheus`: a real server scraping /metrics, `promtool check`) and Chromium (package
# `chromium`). As root with apt-get they are installed when missing; otherwise this says
# how to install them, and fails under CI=true, where those tests must run, not skip.
SYSTEM_PACKAGES := prometheus chromium
SYSTEM_PROGRAMS := /usr/bin/prometheus /usr/bin/promtool /usr/bin/chromium

system-deps:
	@missing=""; \
	for program in $(SYSTEM_PROGRAMS); do \
	  [ -x "$$program" ] || missing="$$missing $$program"; \
	done; \
	[ -z "$$missing" ] && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "system-deps: missing$$missing; apt-get install -y $(SYSTEM_PACKAGES)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y $(SYSTEM_PACKAGES) \
	    || { apt-get update && apt-get install -y $(SYSTEM_PACKAGES); } \
	    || { echo "system-deps: apt-get install $(SYSTEM_PACKAGES) failed" >&2; exit 1; }; \
	else \
	  echo "system-deps: missing$$missing (Debian packages: $(SYSTEM_PACKAGES))." >&2; \
	  echo "system-deps: run 'sudo apt-get install -y $(SYSTEM_PACKAGES)' (or 'make system-deps' as root);" >&2; \
	  echo "system-deps: until then the tests that need them are skipped (they fail under CI=true)." >&2; \
	  case "$${CI:-}" in ""|0|false|no) ;; *) exit 1 ;; esac; \
	fi

# Apache Kafka's jars (KRaft broker, Connect runtime and test connectors, perf tools) for
# tests/interop and `make demo-connect`, fetched once from Maven Central into an ignored
# folder per release: the default one (<kafka.version> in tests/interop/pom.xml) and every
# other release the tests run workers of (<interop.releases>; about 60 MB each, ~10 s with
# a warm ~/.m2). A release written with a trailing "-" has no Connect test connectors
# published (the tests compile connectors of their own with javac). Needs java and mvn;
# without them the interop tests skip (fail under CI=true).
INTEROP_POM := tests/interop/pom.xml
KAFKA_VERSION := $(shell sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' $(INTEROP_POM))
INTEROP_RELEASES := $(shell sed -n 's:.*<interop.releases>\(.*\)</interop.releases>.*:\1:p' $(INTEROP_POM))
INTEROP_VERSIONS := $(sort $(KAFKA_VERSION) $(patsubst %-,%,$(INTEROP_RELEASES)))
INTEROP_STAMPS := $(foreach version,$(INTEROP_VERSIONS),tests/interop/.jars/$(version)/.complete)

tests/interop/.jars/%/.complete: $(INTEROP_POM)
	@if command -v mvn >/dev/null 2>&1 && command -v java >/dev/null 2>&1; then \
	  echo "interop-jars: fetching Apache Kafka $* jars into tests/interop/.jars/$*"; \
	  plugins=""; \
	  case " $(INTEROP_RELEASES) " in *" $*- "*) plugins="-Dno.test.plugins" ;; esac; \
	  rm -rf tests/interop/.jars/$* && mkdir -p tests/interop/.jars && \
	  { mvn -q -B -Dstyle.color=never -f $(INTEROP_POM) dependency:copy-dependencies \
	      -DincludeScope=runtime -Dkafka.version=$* $$plugins -DoutputDirectory=.jars/$* \
	      > tests/interop/.jars/mvn-$*.log 2>&1 \
	    || { cat tests/interop/.jars/mvn-$*.log >&2; exit 1; }; } && \
	  touch $@; \
	else \
	  echo "interop-jars: java or mvn missing (Debian: openjdk-17-jdk-headless maven);" \
	       "the interop tests are skipped (they fail under CI=true)." >&2; \
	  case "$${CI:-}" in ""|0|false|no) ;; *) exit 1 ;; esac; \
	fi

interop-jars: $(INTEROP_STAMPS)

# A KRaft broker, the coordinator in proxy mode and three Connect workers running a
# VerifiableSource and a VerifiableSink (docs/real-connect-workers.md); Ctrl-C stops it.
demo-connect: install interop-jars
	$(BIN)/python -m coordinator.demo_connect $(ARGS)

# -p no:cacheprovider: no .pytest_cache, so a read-only CI checkout works too; --tb=short:
# a line or two per frame, so that the tail of a failed run shows every failure.
test: install system-deps interop-jars
	HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest -q -p no:cacheprovider --tb=short

lint: install
	$(BIN)/ruff check coordinator protocol bench tests
	$(BIN)/mypy coordinator protocol bench

# Stable-heartbeat throughput and latency (coordinator subprocess, 2 processes of trio
# workers), side by side with a 1,000 x 50,000 balanced run in flight (BENCHMARKS.md).
bench: install
	$(BIN)/connect-coordinator bench codec
	$(BIN)/connect-coordinator bench heartbeats --assignor-load
