#!/usr/bin/env python3
"""Write a single-layer OCI image archive (an OCI image layout in a tar) without a registry.

Reads a JSON spec on stdin and writes the archive that `ctr images import` understands:

    {
      "name": "flightcache.local/probe:e2e",          # full reference, becomes the image name
      "entrypoint": ["/usr/local/bin/probe", "serve"],
      "cmd": [], "env": ["PATH=/usr/local/bin:/usr/bin:/bin"], "workdir": "/",
      "files": [{"src": "/host/path", "dst": "/usr/local/bin/probe", "mode": 493}],
      "contents": [{"dst": "/etc/nsswitch.conf", "data": "hosts: files dns\\n", "mode": 420}],
      "dirs": [{"dst": "/tmp", "mode": 1023}]
    }

The layer is reproducible: entries sorted, parents created, owner 0:0, mtime 0, no compression.
Usage: ociarchive.py OUT.tar < spec.json ; prints the manifest digest.
"""

import hashlib
import io
import json
import os
import sys
import tarfile
import tempfile

LAYER = "application/vnd.oci.image.layer.v1.tar"
CONFIG = "application/vnd.oci.image.config.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"


def tarinfo(path, kind, mode, size=0):
    info = tarfile.TarInfo(path.lstrip("/"))
    info.type = kind
    info.mode = mode
    info.size = size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def write_layer(spec, out):
    """Write the layer tar to the open file `out`."""
    entries = {}  # path -> (kind, mode, source or bytes)
    for d in spec.get("dirs", []):
        entries[d["dst"]] = ("dir", d.get("mode", 0o755), None)
    for f in spec.get("files", []):
        mode = f.get("mode", os.stat(f["src"]).st_mode & 0o7777)
        entries[f["dst"]] = ("file", mode, f["src"])
    for c in spec.get("contents", []):
        entries[c["dst"]] = ("data", c.get("mode", 0o644), c["data"].encode())
    for path in list(entries):  # parents of every entry
        parent = os.path.dirname(path)
        while parent not in ("/", ""):
            entries.setdefault(parent, ("dir", 0o755, None))
            parent = os.path.dirname(parent)
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(entries):
            kind, mode, src = entries[path]
            if kind == "dir":
                tar.addfile(tarinfo(path, tarfile.DIRTYPE, mode))
            elif kind == "file":
                with open(src, "rb") as fh:
                    size = os.fstat(fh.fileno()).st_size
                    tar.addfile(tarinfo(path, tarfile.REGTYPE, mode, size), fh)
            else:
                tar.addfile(tarinfo(path, tarfile.REGTYPE, mode, len(src)), io.BytesIO(src))


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def blob(data):
    return hashlib.sha256(data).hexdigest(), data


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: ociarchive.py OUT.tar < spec.json")
    spec = json.load(sys.stdin)
    name = spec["name"]
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    out_path = sys.argv[1]
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(out_path))) as tmp:
        layer_path = os.path.join(tmp, "layer.tar")
        with open(layer_path, "wb") as fh:
            write_layer(spec, fh)
        layer_digest = sha256_file(layer_path)
        layer_size = os.path.getsize(layer_path)

        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Entrypoint": spec.get("entrypoint") or None,
                "Cmd": spec.get("cmd") or None,
                "Env": spec.get("env", ["PATH=/usr/local/bin:/usr/bin:/bin"]),
                "WorkingDir": spec.get("workdir", "/"),
            },
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + layer_digest]},
            "history": [{"created_by": "flightcache e2e/images"}],
        }
        config_digest, config_bytes = blob(json.dumps(config, sort_keys=True).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "digest": "sha256:" + config_digest, "size": len(config_bytes)},
            "layers": [{"mediaType": LAYER, "digest": "sha256:" + layer_digest, "size": layer_size}],
        }
        manifest_digest, manifest_bytes = blob(json.dumps(manifest, sort_keys=True).encode())
        index = {
            "schemaVersion": 2,
            "mediaType": INDEX,
            "manifests": [
                {
                    "mediaType": MANIFEST,
                    "digest": "sha256:" + manifest_digest,
                    "size": len(manifest_bytes),
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": tag,
                    },
                }
            ],
        }
        part = out_path + ".part"
        with tarfile.open(part, mode="w", format=tarfile.PAX_FORMAT) as tar:

            def add_bytes(path, data):
                tar.addfile(tarinfo(path, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))

            tar.addfile(tarinfo("blobs", tarfile.DIRTYPE, 0o755))
            tar.addfile(tarinfo("blobs/sha256", tarfile.DIRTYPE, 0o755))
            add_bytes("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
            add_bytes("index.json", json.dumps(index, sort_keys=True).encode())
            add_bytes("blobs/sha256/" + config_digest, config_bytes)
            add_bytes("blobs/sha256/" + manifest_digest, manifest_bytes)
            with open(layer_path, "rb") as fh:
                tar.addfile(tarinfo("blobs/sha256/" + layer_digest, tarfile.REGTYPE, 0o644, layer_size), fh)
        os.replace(part, out_path)
    print("sha256:" + manifest_digest)


if __name__ == "__main__":
    main()
