#!/usr/bin/env bash
# Get the third-party sources the firmware builds need, outside the repository:
#
#   fetch-sources.sh micropython DIR           MicroPython v1.28.0 and micropython-lib into DIR
#   fetch-sources.sh submodules DIR NAME...    lib/NAME of the MicroPython checkout in DIR
#                                              (tinyusb stm32lib lwip mbedtls pico-sdk ...)
#   fetch-sources.sh circuitpython DIR         CircuitPython 10.2.1 and the libraries its unix port needs
#   fetch-sources.sh picotool PREFIX SDK       build picotool (for pico-sdk's UF2 step) into PREFIX
#   fetch-sources.sh vendor                    print the vendor directory in use (empty if none)
#
# Sources come from vendored archives when there are some (they are checked against the
# sha256 below), else from git (MicroPython's tag and its submodules; needs the network).
# Vendored archives are looked for in $MICROTRAIN_VENDOR, then in shared/vendor beside the
# repository or beside a folder above it, then where they were found last (a link in
# ~/.cache/microtrain/vendor, which a find updates; host/microtrain/thirdparty.py looks the
# same way). MICROPY_TARBALL names a MicroPython source tarball
# to use instead (a vendored `git archive`, or an official micropython-1.28.0.tar.xz, whose
# top directory is stripped and which already holds the submodules).
# Unpacking happens under a lock, into a temporary directory renamed into place, so that
# concurrent builds sharing one checkout never see half a tree.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
MICROPY_TAG=v1.28.0
MICROPY_GIT=https://github.com/micropython/micropython
CIRCUITPY_TAG=10.2.1

# archive -> sha256 (from the vendor directory's README.md)
declare -A SHA256=(
    [micropython-v1.28.0.tar.gz]=0505bb13571f92b184c0fa6c02b0dbf96db631f2728ce36f4ce5bde58f316f9d
    [micropython-lib-8380c7bb.tar.gz]=340e11f8c916d652561d413f7556f0a537c224aba4664a98d4f44e9f3f0782ef
    [tinyusb-aa0fc2e0.tar.gz]=da00f886d7e967515e4bfae365a06177ba080c7281651447ce0f31d74f4f7574
    [stm32lib-928df866-F4F7.tar.gz]=9ffcbdf6eb23e034802df50facc9f22b25ad9ebb92435bc81a1ca4a65ae4aea6
    [lwip-77dcd25a.tar.gz]=cb441155ad76b887527edac638d77f4250efa964f6573042fc7cebdcc69f2dbf
    [pico-sdk-a1438dff.tar.gz]=6086c43af000a0fc84a7db0cbb32991e1a96c8ee16401b5227a94e73cc1175a2
    [picotool-282a3ca0.tar.gz]=075998ee4c4d46ac7deab3bda9788792ed8c98b51ab8a1889e3b83d368dc153e
    [mbedtls-107ea89d.tar.gz]=1c85cdb35b285605dc867f9cfaec3b383b667cf63a5e28bd16350488b9c20b31
    [circuitpython-10.2.1.tar.gz]=feedf12ea455852328b0a2860bcd1e3c1199b9425c6f64e40fdef3bb28cfc64d
    [cp-lib-adafruit_floppy-a20190fb.tar.gz]=dca6bb91181755f494c61d6809cfe9a47201148756c8de5fd2d3c06708ac4217
    [cp-lib-micropython-lib-6ae440a8.tar.gz]=b02e27330fc231e5990ba4b827f5dc944d825b7271072d9ddaf6f2810a69fd71
    [cp-lib-mp3-aac02afd.tar.gz]=c4f55f80db7f5649637b0c026ed9c4dd5552b0b4d802f057802bf24a6cfd614d
    [cp-lib-quirc-8c6ffa22.tar.gz]=793236cf4e2f48be64deec02b0608a4679cd92a25cbb3fd6ea197f43de0cbbb1
)
# MicroPython submodule (lib/NAME) -> vendored archive
declare -A SUBMODULE_ARCHIVE=(
    [micropython-lib]=micropython-lib-8380c7bb.tar.gz
    [tinyusb]=tinyusb-aa0fc2e0.tar.gz
    [stm32lib]=stm32lib-928df866-F4F7.tar.gz
    [lwip]=lwip-77dcd25a.tar.gz
    [mbedtls]=mbedtls-107ea89d.tar.gz
    [pico-sdk]=pico-sdk-a1438dff.tar.gz
)
# CircuitPython: directory under the tree -> archive
declare -A CIRCUITPY_ARCHIVES=(
    [.]=circuitpython-10.2.1.tar.gz
    [lib/mp3]=cp-lib-mp3-aac02afd.tar.gz
    [lib/quirc]=cp-lib-quirc-8c6ffa22.tar.gz
    [lib/adafruit_floppy]=cp-lib-adafruit_floppy-a20190fb.tar.gz
    [lib/micropython-lib]=cp-lib-micropython-lib-6ae440a8.tar.gz
)
PICOTOOL_ARCHIVE=picotool-282a3ca0.tar.gz

say() { echo "microtrain: $*" >&2; }
die() { say "$*"; exit 1; }

has_vendor() { [ -n "$1" ] && [ -f "$1/micropython-v1.28.0.tar.gz" ]; }
vendor_dir() {
    local d up cache="$HOME/.cache/microtrain/vendor"
    if [ -n "${MICROTRAIN_VENDOR:-}" ]; then
        has_vendor "$MICROTRAIN_VENDOR" && (cd "$MICROTRAIN_VENDOR" && pwd)
        return
    fi
    up=$ROOT
    while [ "$up" != / ]; do
        up=$(dirname "$up")
        d=${up%/}/shared/vendor
        if has_vendor "$d"; then
            d=$(cd "$d" && pwd)
            # remembered for a clone elsewhere on this machine, as thirdparty.py remembers it
            mkdir -p "$(dirname "$cache")" 2>/dev/null && ln -sfn "$d" "$cache.$$" 2>/dev/null \
                && mv -Tf "$cache.$$" "$cache" 2>/dev/null
            echo "$d"
            return
        fi
    done
    has_vendor "$cache" && (cd "$cache" && pwd -P)
}
VENDOR=$(vendor_dir)

# vendored archive path, checked, or nothing
vendored() {
    local f="$VENDOR/$1"
    [ -n "$VENDOR" ] && [ -f "$f" ] || return 0
    echo "${SHA256[$1]}  $f" | sha256sum -c --quiet - >/dev/null 2>&1 \
        || die "$f does not have the sha256 firmware/fetch-sources.sh expects; replace it"
    echo "$f"
}

empty_dir() { [ ! -d "$1" ] || [ -z "$(ls -A "$1")" ]; }

# unpack ARCHIVE into DEST (which must be missing or empty), through DEST.tmp.PID
unpack() {
    local archive=$1 dest=$2 tmp="$2.tmp.$$"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    tar -xf "$archive" -C "$tmp"
    # an archive with one top directory (e.g. micropython-1.28.0/) is unpacked from inside it
    local top
    top=$(ls -A "$tmp")
    if [ "$(echo "$top" | wc -l)" = 1 ] && [ -d "$tmp/$top" ] && [ ! -e "$tmp/py" ]; then
        mv "$tmp/$top" "$tmp.inner" && rmdir "$tmp" && mv "$tmp.inner" "$tmp"
    fi
    rmdir "$dest" 2>/dev/null || true
    mkdir -p "$(dirname "$dest")"
    mv "$tmp" "$dest"
    say "unpacked $(basename "$archive") into $dest"
}

# run the rest of this command under an exclusive lock on LOCKFILE
with_lock() {
    local lock=$1
    shift
    mkdir -p "$(dirname "$lock")"
    if [ -z "${MICROTRAIN_LOCKED:-}" ] && command -v flock >/dev/null; then
        MICROTRAIN_LOCKED=1 exec flock "$lock" "$0" "$@"
    fi
}

micropython_version() {
    awk '/^#define MICROPY_VERSION_(MAJOR|MINOR|MICRO) /{v = v (v == "" ? "" : ".") $3} END {print v}' \
        "$1/py/mpconfig.h" 2>/dev/null
}

get_micropython() {
    local dir=$1
    if [ ! -f "$dir/py/mpconfig.h" ]; then
        empty_dir "$dir" || die "$dir exists and is not a MicroPython checkout; remove it or set MICROPY_DIR"
        local tarball=${MICROPY_TARBALL:-}
        if [ -n "$tarball" ]; then
            [ -f "$tarball" ] || die "MICROPY_TARBALL=$tarball: no such file"
            unpack "$tarball" "$dir"
        elif git clone -q --depth 1 --branch "$MICROPY_TAG" "$MICROPY_GIT" "$dir.tmp.$$" 2>/dev/null; then
            rmdir "$dir" 2>/dev/null || true
            mv "$dir.tmp.$$" "$dir"
            say "cloned MicroPython $MICROPY_TAG into $dir"
        else
            rm -rf "$dir.tmp.$$"
            tarball=$(vendored micropython-v1.28.0.tar.gz)
            [ -n "$tarball" ] || die "cannot get MicroPython $MICROPY_TAG: git clone of $MICROPY_GIT failed and no tarball" \
                "(set MICROPY_TARBALL to a MicroPython source tarball, or MICROTRAIN_VENDOR to the vendor directory)"
            unpack "$tarball" "$dir"
        fi
    fi
    local v
    v=$(micropython_version "$dir")
    [ "$v" = "${MICROPY_TAG#v}" ] || say "warning: MicroPython at $dir is $v; microtrain is built and tested with $MICROPY_TAG"
    get_submodules "$dir" micropython-lib
}

get_submodules() {
    local dir=$1 name archive
    shift
    for name in "$@"; do
        empty_dir "$dir/lib/$name" || continue
        archive=
        if [ -n "${SUBMODULE_ARCHIVE[$name]:-}" ]; then
            archive=$(vendored "${SUBMODULE_ARCHIVE[$name]}")
        fi
        if [ -n "$archive" ]; then
            unpack "$archive" "$dir/lib/$name"
        elif [ -e "$dir/.git" ]; then
            git -C "$dir" submodule update -q --init --depth 1 "lib/$name" \
                || die "git submodule update of lib/$name in $dir failed (offline? set MICROTRAIN_VENDOR)"
        else
            die "$dir/lib/$name is empty, $dir is not a git checkout and no vendored archive of it was found" \
                "(set MICROTRAIN_VENDOR, or fill it by hand: git clone the submodule at the commit v1.28.0 pins)"
        fi
    done
}

get_circuitpython() {
    local dir=$1 sub archive
    if [ ! -f "$dir/py/circuitpy_mpconfig.h" ]; then
        empty_dir "$dir" || die "$dir exists and is not a CircuitPython tree; remove it or set CIRCUITPY_DIR"
        archive=$(vendored "${CIRCUITPY_ARCHIVES[.]}")
        [ -n "$archive" ] || die "no vendored CircuitPython $CIRCUITPY_TAG archives (set MICROTRAIN_VENDOR); see firmware/README.md"
        local tmp="$dir.build.$$"
        rm -rf "$tmp"
        unpack "$archive" "$tmp"
        for sub in "${!CIRCUITPY_ARCHIVES[@]}"; do
            [ "$sub" = . ] && continue
            archive=$(vendored "${CIRCUITPY_ARCHIVES[$sub]}")
            [ -n "$archive" ] || die "vendored ${CIRCUITPY_ARCHIVES[$sub]} missing"
            rm -rf "${tmp:?}/$sub"
            unpack "$archive" "$tmp/$sub"
        done
        # CircuitPython's build reads its version from git tags
        (cd "$tmp" && git init -q && git -c core.autocrlf=false -c core.safecrlf=false add -A && \
            git -c user.name=microtrain -c user.email=microtrain@localhost commit -q -m "CircuitPython $CIRCUITPY_TAG sources" && \
            git tag "$CIRCUITPY_TAG")
        rmdir "$dir" 2>/dev/null || true
        mv "$tmp" "$dir"
        say "CircuitPython $CIRCUITPY_TAG ready in $dir"
    fi
}

get_picotool() {
    local prefix=$1 sdk=$2
    [ -f "$prefix/lib/cmake/picotool/picotoolConfig.cmake" ] && return
    local archive
    archive=$(vendored "$PICOTOOL_ARCHIVE")
    [ -n "$archive" ] || die "no vendored $PICOTOOL_ARCHIVE (set MICROTRAIN_VENDOR); pico-sdk needs picotool to make UF2 images"
    local work="$prefix.work.$$"
    rm -rf "$work"
    unpack "$archive" "$work/src"
    cmake -S "$work/src" -B "$work/build" -DPICO_SDK_PATH="$sdk" -DPICOTOOL_NO_LIBUSB=1 \
        -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_BUILD_TYPE=Release >"$work/cmake.log" 2>&1 \
        || { cat "$work/cmake.log" >&2; die "configuring picotool failed"; }
    cmake --build "$work/build" -j "${MICROTRAIN_JOBS:-2}" >"$work/build.log" 2>&1 \
        || { tail -40 "$work/build.log" >&2; die "building picotool failed"; }
    cmake --install "$work/build" >/dev/null
    rm -rf "$work"
    say "picotool built into $prefix"
}

cmd=${1:-}
case "$cmd" in
    micropython)
        [ $# = 2 ] || die "usage: $0 micropython DIR"
        with_lock "$2.lock" "$@"
        get_micropython "$2" ;;
    submodules)
        [ $# -ge 2 ] || die "usage: $0 submodules DIR NAME..."
        with_lock "$2.lock" "$@"
        [ -f "$2/py/mpconfig.h" ] || die "no MicroPython checkout at $2 (make micropython)"
        dir=$2; shift 2
        get_submodules "$dir" "$@" ;;
    circuitpython)
        [ $# = 2 ] || die "usage: $0 circuitpython DIR"
        with_lock "$2.lock" "$@"
        get_circuitpython "$2" ;;
    picotool)
        [ $# = 3 ] || die "usage: $0 picotool PREFIX PICO_SDK_PATH"
        with_lock "$2.lock" "$@"
        get_picotool "$2" "$3" ;;
    vendor)
        echo "$VENDOR" ;;
    *)
        sed -n '2,/^set -e/p' "$0" | sed -n 's/^# \{0,1\}//p' >&2
        exit 2 ;;
esac
