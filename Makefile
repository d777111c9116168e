# corral — see README.md. Targets: build, run, test, bench, lint, install.
GO       ?= go
BIN      := bin
VERSION  ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
# Static, cgo-free binaries: corrald sets no_new_privs on all its threads
# (syscall.AllThreadsSyscall), which needs a cgo-free build.
export CGO_ENABLED := 0
LDFLAGS  := -s -w -X main.version=$(VERSION)
SOCKET   ?= /run/corral/corrald.sock
STATEDIR ?= /var/lib/corral
# Bounded fuzzing of the request decoder and param validation in make test.
FUZZTIME ?= 20s
# Pinned so every machine runs the same checks; go run fetches it through the
# module proxy, so a fresh clone needs nothing installed by hand.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: build run test fuzz bench lint install clean

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/corrald ./cmd/corrald
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/corralctl ./cmd/corralctl
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/corral-shim ./cmd/corral-shim

# Runs corrald in the foreground (as root). Another shell:
#   bin/corralctl run -- echo hello
run: build
	$(BIN)/corrald --socket $(SOCKET) --state-dir $(STATEDIR) --log-format console

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) mod tidy -diff
	$(GO) run $(STATICCHECK) ./...

# Unit tests (race detector on), then the integration tests: against a real
# corrald on this host, and inside a private systemd booted by tests/harness.
# One package at a time (-p 1): several tests check limits and timings of
# real processes, which two packages' daemons fighting over two cores would
# blur.
test: lint build
	CGO_ENABLED=1 $(GO) test -race -count=1 -p 1 -timeout 30m ./...
	$(MAKE) fuzz

fuzz:
	@for f in $$($(GO) test -list '^Fuzz' ./ipc/ 2>/dev/null | grep '^Fuzz'); do \
		echo "fuzz ipc $$f for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) ./ipc/ || exit 1; \
	done
	@for f in $$($(GO) test -list '^Fuzz' ./reactor/ 2>/dev/null | grep '^Fuzz'); do \
		echo "fuzz reactor $$f for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) ./reactor/ || exit 1; \
	done

bench: build
	CORRAL_BENCH=1 $(GO) test -run '^TestBenchSuite$$' -count=1 -timeout 15m -v ./bench/
	@echo "== store: durable transitions per second under concurrent writers"
	$(GO) test -run '^$$' -bench '^BenchmarkTransitions' -benchtime 2s ./store/

install: build
	DESTDIR=$(DESTDIR) BIN_SRC=$(BIN) sh deploy/install.sh

clean:
	rm -rf $(BIN)
