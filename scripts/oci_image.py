#!/usr/bin/env python3
"""Writes a staged root file system as a one-layer OCI image archive, reproducibly.

    oci_image.py ROOTFS ARCHIVE --version V --epoch S [--label K=V ...] [--entrypoint JSON]

Called by scripts/build-image.sh. Standard library only, no daemon. The same ROOTFS contents
give the same bytes, hence the same digests, whatever the files' mtimes, owners or the order
the file system lists them in:

- tar entries sorted by path, uid/gid 0 with no user or group names, every mtime set to
  --epoch (SOURCE_DATE_EPOCH), modes reduced to 0755 (directories and executables) or 0644;
- the layer is an uncompressed tar (no gzip header time, no dependence on the zlib version);
- the image config has no "created" time and no history;
- the archive (an OCI image layout: oci-layout, index.json, blobs/sha256/...) is itself a
  tar written by the same rules.

Prints the manifest digest (sha256:...) on stdout; ARCHIVE.digest holds the same line.
"""

import argparse
import hashlib
import io
import json
import os
import stat
import sys
import tarfile

LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"


def canonical_json(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def normalized(info, epoch):
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = epoch
    if info.isdir() or info.mode & 0o111:
        info.mode = 0o755
    else:
        info.mode = 0o644
    return info


def layer_tar(rootfs, epoch):
    """The rootfs as tar bytes: sorted, owned by root, one mtime."""
    paths = []
    for top, dirs, files in os.walk(rootfs):
        for name in dirs + files:
            paths.append(os.path.relpath(os.path.join(top, name), rootfs))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in sorted(paths):
            full = os.path.join(rootfs, rel)
            mode = os.lstat(full).st_mode
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                sys.exit(f"{full}: only directories, files and symlinks belong in the image")
            info = normalized(tar.gettarinfo(full, arcname=rel), epoch)
            if info.isreg():
                with open(full, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def blobs_tar(blobs, epoch):
    """An OCI image layout as tar bytes: {path: bytes}, directories implied."""
    dirs = set()
    for path in blobs:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(dirs | set(blobs)):
            info = tarfile.TarInfo(path)
            if path in dirs:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(normalized(info, epoch))
            else:
                info.size = len(blobs[path])
                info.mode = 0o644
                tar.addfile(normalized(info, epoch), io.BytesIO(blobs[path]))
    return buf.getvalue()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rootfs")
    p.add_argument("archive")
    p.add_argument("--version", required=True)
    p.add_argument("--epoch", type=int, required=True)
    p.add_argument("--ref-name", required=True, help="index.json's image ref name")
    p.add_argument("--label", action="append", default=[], help="KEY=VALUE")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE")
    p.add_argument("--cmd", default="[]", help="the image's Cmd, as a JSON array")
    args = p.parse_args()

    layer = layer_tar(args.rootfs, args.epoch)
    labels = dict(kv.split("=", 1) for kv in args.label)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": args.env, "Cmd": json.loads(args.cmd), "Labels": labels},
        "rootfs": {"type": "layers", "diff_ids": [sha256(layer)]},
    }
    config_bytes = canonical_json(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": sha256(config_bytes),
                   "size": len(config_bytes)},
        "layers": [{"mediaType": LAYER_TYPE, "digest": sha256(layer), "size": len(layer)}],
        "annotations": {"org.opencontainers.image.version": args.version},
    }
    manifest_bytes = canonical_json(manifest)
    digest = sha256(manifest_bytes)
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": MANIFEST_TYPE, "digest": digest, "size": len(manifest_bytes),
            "annotations": {"org.opencontainers.image.ref.name": args.ref_name},
        }],
    }
    blobs = {"oci-layout": canonical_json({"imageLayoutVersion": "1.0.0"}),
             "index.json": canonical_json(index)}
    for data in (layer, config_bytes, manifest_bytes):
        blobs["blobs/sha256/" + sha256(data).split(":")[1]] = data

    tmp = args.archive + ".tmp"
    with open(tmp, "wb") as f:
        f.write(blobs_tar(blobs, args.epoch))
    os.replace(tmp, args.archive)
    with open(args.archive + ".digest", "w") as f:
        f.write(digest + "\n")
    print(digest)


if __name__ == "__main__":
    main()
