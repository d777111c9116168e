#!/bin/sh
# Install corral: binaries from ./bin (or $BIN_SRC) to /usr/local/bin, the
# man pages and shell completions `make docs` generates beside them to
# /usr/local/share, the systemd units to /etc/systemd/system, and the
# "corral" group whose
# members may use the API socket. Idempotent: running it again updates the
# files and leaves an existing group alone.
#
#   DESTDIR=/tmp/stage sh deploy/install.sh   # stage only: no group, no reload
#   sh deploy/install.sh --enable             # also enable and start the socket
#
# Environment: DESTDIR (staging root, default empty), BIN_SRC (default
# ./bin), PREFIX (default /usr/local), UNITDIR (default /etc/systemd/system).
set -eu

enable=no
for arg in "$@"; do
	case "$arg" in
	--enable) enable=yes ;;
	-h|--help) sed -n '2,14p' "$0"; exit 0 ;;
	*) echo "install.sh: unknown argument $arg" >&2; exit 2 ;;
	esac
done

here=$(cd "$(dirname "$0")" && pwd)
DESTDIR=${DESTDIR:-}
BIN_SRC=${BIN_SRC:-./bin}
PREFIX=${PREFIX:-/usr/local}
UNITDIR=${UNITDIR:-/etc/systemd/system}

bindir="$DESTDIR$PREFIX/bin"
unitdir="$DESTDIR$UNITDIR"

installed=0
install -d -m 0755 "$bindir" "$unitdir"
for b in corrald corralctl corral-shim; do
	if [ -f "$BIN_SRC/$b" ]; then
		install -m 0755 "$BIN_SRC/$b" "$bindir/$b"
		echo "installed $bindir/$b"
		installed=$((installed + 1))
	else
		echo "install.sh: $BIN_SRC/$b not found; skipped (build with: go build -o bin/ ./cmd/...)" >&2
	fi
done
share="$DESTDIR$PREFIX/share"
for f in man/corrald.8:man/man8/corrald.8 man/corralctl.1:man/man1/corralctl.1 \
	completions/corralctl.bash:bash-completion/completions/corralctl \
	completions/_corralctl:zsh/site-functions/_corralctl \
	completions/corralctl.fish:fish/vendor_completions.d/corralctl.fish; do
	src=$BIN_SRC/${f%%:*} dst=$share/${f#*:}
	if [ -f "$src" ]; then
		install -D -m 0644 "$src" "$dst"
		echo "installed $dst"
	else
		echo "install.sh: $src not found; skipped (generate with: make docs)" >&2
	fi
done
for u in corrald.service corrald.socket corral.slice; do
	install -m 0644 "$here/$u" "$unitdir/$u"
	echo "installed $unitdir/$u"
done
if [ "$PREFIX" != /usr/local ]; then
	# The unit runs /usr/local/bin/corrald; point it at the chosen prefix.
	sed -i "s|^ExecStart=/usr/local/bin/corrald|ExecStart=$PREFIX/bin/corrald|" "$unitdir/corrald.service"
fi

if [ -n "$DESTDIR" ]; then
	echo "DESTDIR set: not creating group corral, not reloading systemd"
	exit 0
fi

if ! getent group corral >/dev/null 2>&1; then
	groupadd --system corral
	echo "created group corral (add users with: usermod -aG corral USER)"
fi

if [ -d /run/systemd/system ]; then
	systemctl daemon-reload
	if [ "$enable" = yes ]; then
		systemctl enable --now corrald.socket
		systemctl enable corrald.service
		echo "enabled corrald.socket (corrald starts on the first connection)"
	else
		echo "next: systemctl enable --now corrald.socket"
	fi
else
	echo "systemd is not running here; units installed but not loaded"
fi
