#!/usr/bin/env bash
# Builds the sticky-cni container image that packaging/kubernetes/sticky-cni-daemonset.yaml
# names, as an OCI archive, reproducibly and without a daemon.
#
#   scripts/build-image.sh [--bin-dir DIR] [--out ARCHIVE] [--update-manifest [FILE] | --check-manifest [FILE]]
#
# Without --bin-dir it runs scripts/build-release.sh (static binaries) and takes target/release.
# The image is the binaries and exactly what they need, on an empty base:
#   /sticky-cni/bin/sticky-ipam, sticky-vxlan    the plugins (the init container copies them to the
#                                                node's /opt/cni/bin)
#   /sticky-cni/bin/sticky-vxlan-agent           the node agent (the DaemonSet's main container runs
#                                                it; it is never copied to the node)
#   /sticky-cni/bin/sticky-wg                    the sites gateway's WireGuard data path (the
#                                                DaemonSet's second container runs it; never copied)
#   the shared libraries `ldd` lists for them, and the dynamic loader, at the paths ldd prints
#       (none for the static binaries scripts/build-release.sh makes; a dynamic --bin-dir build
#       brings its glibc)
#   /bin/busybox (Debian's busybox-static) and its applets sh cp chmod sync mv rm awk: what the
#       init container's install script (in the manifest) runs, nothing more
#   /usr/share/doc/<package>/copyright           for each Debian package a shipped file comes from
#   /sticky-cni/conf-examples/                   the example configurations
# scripts/oci_image.py writes it: sorted tar entries, uid/gid 0, every mtime SOURCE_DATE_EPOCH
# (default: the time of the last commit that changed the sources or these scripts), no
# timestamp in the config. The same binaries give the same digest.
#
# Output: ARCHIVE (default target/image/sticky-cni-<version>.oci.tar), ARCHIVE.digest (the
# manifest digest, also printed last). --update-manifest rewrites the image of every container
# of FILE (default the DaemonSet) to registry.example.org/sticky-cni:<version>@<digest>;
# --check-manifest exits 1 unless every container of FILE already names that (the release check).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

bin_dir=""
out=""
manifest=""
manifest_mode=""
while (($#)); do
    case $1 in
        --bin-dir) bin_dir=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --update-manifest | --check-manifest)
            manifest_mode=${1#--}
            manifest=$repo/packaging/kubernetes/sticky-cni-daemonset.yaml
            shift
            if (($#)) && [[ $1 != --* ]]; then manifest=$1; shift; fi
            ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "build-image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
registry=registry.example.org
target_dir=${CARGO_TARGET_DIR:-$repo/target}
if [[ -z $bin_dir ]]; then
    scripts/build-release.sh >&2
    bin_dir=$target_dir/release
fi
out=${out:-$target_dir/image/sticky-cni-$version.oci.tar}
if [[ -z ${SOURCE_DATE_EPOCH:-} ]]; then
    # The last change to what goes into the image: pinning the digest in the manifest (a commit
    # of the manifest alone) does not change it.
    SOURCE_DATE_EPOCH=$(git log -1 --format=%ct -- crates Cargo.toml Cargo.lock conf-examples scripts/build-image.sh scripts/oci_image.py 2>/dev/null)
    SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-0}
fi

busybox=/bin/busybox
if [[ ! -x $busybox ]] || ldd "$busybox" >/dev/null 2>&1; then
    echo "build-image.sh: needs a static $busybox (apt-get install busybox-static)" >&2
    exit 1
fi

mkdir -p "$(dirname "$out")"
stage=$(mktemp -d "$(dirname "$out")/.stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT
root=$stage/rootfs

# put SRC DEST: copies SRC's contents (through symlinks) to DEST inside the image.
put() {
    mkdir -p "$root$(dirname "$2")"
    cp -L "$1" "$root$2"
}
# copyright_of PATH: the copyright file of the Debian package that owns PATH, if any.
copyright_of() {
    command -v dpkg >/dev/null || return 0
    local pkg
    pkg=$(dpkg -S "$1" 2>/dev/null || dpkg -S "$(readlink -f "$1")" 2>/dev/null) || return 0
    pkg=${pkg%%:*}
    [[ -f /usr/share/doc/$pkg/copyright ]] && put "/usr/share/doc/$pkg/copyright" "/usr/share/doc/$pkg/copyright"
    return 0
}

for b in sticky-ipam sticky-vxlan sticky-vxlan-agent sticky-wg; do
    [[ -x $bin_dir/$b ]] || { echo "build-image.sh: no $bin_dir/$b" >&2; exit 1; }
    put "$bin_dir/$b" "/sticky-cni/bin/$b"
    # "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" and "/lib64/ld-linux-x86-64.so.2 (0x...)"
    while read -r lib; do
        put "$lib" "$lib"
        copyright_of "$lib"
    done < <(ldd "$bin_dir/$b" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
done
put "$busybox" /bin/busybox
copyright_of "$busybox"
for applet in sh cp chmod sync mv rm awk; do
    ln -s busybox "$root/bin/$applet"
done
mkdir -p "$root/sticky-cni"
cp -r conf-examples "$root/sticky-cni/conf-examples"

digest=$(python3 scripts/oci_image.py "$root" "$out" \
    --version "$version" --epoch "$SOURCE_DATE_EPOCH" --ref-name "sticky-cni:$version" \
    --env PATH=/bin \
    --cmd '["/sticky-cni/bin/sticky-vxlan", "--version"]' \
    --label org.opencontainers.image.title=sticky-cni \
    --label "org.opencontainers.image.version=$version" \
    --label "org.opencontainers.image.description=sticky-ipam and sticky-vxlan CNI plugins and the sticky-vxlan node agent")

ref="$registry/sticky-cni:$version@$digest"
if [[ $manifest_mode == update-manifest ]]; then
    sed -i -E "s#^( *image: )[^ ]*/sticky-cni:.*#\1$ref#" "$manifest"
    echo "build-image.sh: $manifest now names $ref" >&2
elif [[ $manifest_mode == check-manifest ]]; then
    if grep -E '^ *image: ' "$manifest" | grep -vqF "image: $ref"; then
        echo "build-image.sh: $manifest does not name $ref:" >&2
        grep -E '^ *image: ' "$manifest" >&2
        echo "$digest"
        exit 1
    fi
    echo "build-image.sh: $manifest names $ref" >&2
fi
echo "build-image.sh: wrote $out" >&2
echo "$digest"
