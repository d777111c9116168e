#!/bin/sh
# Build corral's Debian package with dpkg-deb from what `make docs` left in
# $BIN_SRC: the binaries, man pages and completions, plus the units. The
# package is written to $OUT (default: $BIN_SRC) and its path printed last.
#
#   make deb                          # the usual way
#   BIN_SRC=bin VERSION=1.0 sh deploy/deb/build.sh
#
# Environment: BIN_SRC (default ./bin), OUT (default $BIN_SRC), VERSION
# (default from git: 0~git<commit time>.<hash>), ARCH (default: dpkg's).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
BIN_SRC=${BIN_SRC:-./bin}
OUT=${OUT:-$BIN_SRC}
ARCH=${ARCH:-$(dpkg --print-architecture)}
if [ -z "${VERSION:-}" ]; then
	# A Debian version must start with a digit; 0~git sorts before any
	# release. The commit time makes later commits sort later.
	VERSION=0~git$(git -C "$repo" log -1 --format=%cd --date=format:%Y%m%d%H%M%S).$(git -C "$repo" rev-parse --short=8 HEAD)
fi
# The changelog's date is the commit's too, so that two builds of one
# commit give the same package.
date=$(git -C "$repo" log -1 --format=%cD 2>/dev/null || date -R)
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || date +%s)}
export SOURCE_DATE_EPOCH

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/root

# Files: the Debian layout (binaries in /usr/bin, units in /lib/systemd/system
# as bookworm's debhelper puts them, zsh completions in vendor-completions).
DESTDIR=$root BIN_SRC=$BIN_SRC PREFIX=/usr UNITDIR=/lib/systemd/system sh "$repo/deploy/install.sh" >/dev/null
mv "$root/usr/share/zsh/site-functions" "$root/usr/share/zsh/vendor-completions"
gzip -9n "$root/usr/share/man/man8/corrald.8" "$root/usr/share/man/man1/corralctl.1"
install -D -m 0644 "$here/corral.preset" "$root/lib/systemd/system-preset/80-corral.preset"
install -D -m 0644 "$here/copyright" "$root/usr/share/doc/corral/copyright"
install -D -m 0644 "$here/lintian-overrides" "$root/usr/share/lintian/overrides/corral"
printf 'corral (%s) unstable; urgency=medium\n\n  * Built from commit %s.\n\n -- corral developers <corral@corral.invalid>  %s\n' \
	"$VERSION" "$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)" "$date" |
	gzip -9n >"$root/usr/share/doc/corral/changelog.gz"
chmod 0644 "$root/usr/share/doc/corral/changelog.gz"

install -d -m 0755 "$root/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s/@VERSION@/$VERSION/" -e "s/@ARCH@/$ARCH/" -e "s/@SIZE@/$size/" "$here/control" >"$root/DEBIAN/control"
for s in postinst prerm postrm; do
	install -m 0755 "$here/$s" "$root/DEBIAN/$s"
done
(cd "$root" && find . -type f ! -path './DEBIAN/*' -printf '%P\n' | LC_ALL=C sort | xargs md5sum) >"$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/md5sums" "$root/DEBIAN/control"
find "$root" -type d -exec chmod 0755 {} +
find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

mkdir -p "$OUT"
deb=$OUT/corral_${VERSION}_${ARCH}.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
