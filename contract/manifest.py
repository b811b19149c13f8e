"""Signed manifests: the sha256 of every file of a model version, signed with an Ed25519 key.

A signed model directory holds its files and two more: `manifest.json` (`{"format": 1, "key_id": ..., "files":
{relative path: sha256}}`) and `manifest.sig` (the base64 Ed25519 signature of manifest.json's bytes).
`verify_directory` accepts a directory only when the signature is valid for the trusted public key and every
file, and no other, matches the manifest. The pipeline holds the private key; a service needs only the public one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

MANIFEST, SIGNATURE = "manifest.json", "manifest.sig"
FORMAT = 1


class ManifestError(RuntimeError):
    """A model version that must not be used: unsigned, signed by another key, or a file changed, missing or added."""


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def key_id(public_key: Ed25519PublicKey) -> str:
    """A short fingerprint of a public key (16 hex digits of the sha256 of its raw bytes)."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def public_key_path(private_key_path: Path) -> Path:
    """Where the public half of a key pair lives: beside the private key, with the suffix `.pub`."""
    return private_key_path.with_suffix(".pub")


def load_signing_key(path: Path, create: bool = True) -> Ed25519PrivateKey:
    """The pipeline's private key (PEM, PKCS#8). When missing and `create`, a new key pair is written: the private
    key readable by its owner only, the public key at `public_key_path(path)`."""
    if path.exists():
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ManifestError(f"{path}: not an Ed25519 private key")
        return key
    if not create:
        raise ManifestError(f"no signing key at {path}")
    key = Ed25519PrivateKey.generate()
    path.parent.mkdir(parents=True, exist_ok=True)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(pem)
    public_key_path(path).write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    print(f"created the model signing key pair {path} (keep it secret) and {public_key_path(path)} (for services)")
    return key


def load_verify_key(path: Path) -> Ed25519PublicKey:
    """A trusted public key (PEM)."""
    if not path.is_file():
        raise ManifestError(f"no public key at {path}: copy the pipeline's {path.name} there, or set the key path")
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except ValueError as error:
        raise ManifestError(f"{path}: not a PEM public key ({error})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ManifestError(f"{path}: not an Ed25519 public key")
    return key


def _files(directory: Path) -> dict[str, str]:
    """{relative posix path: sha256} of every regular file under `directory` but the manifest and its signature."""
    return {path.relative_to(directory).as_posix(): sha256_file(path)
            for path in sorted(directory.rglob("*"))
            if path.is_file() and path.relative_to(directory).as_posix() not in (MANIFEST, SIGNATURE)}


def sign_directory(directory: Path, private_key: Ed25519PrivateKey) -> dict:
    """Write `manifest.json` and `manifest.sig` for the files now in `directory`; returns the manifest."""
    manifest = {"format": FORMAT, "key_id": key_id(private_key.public_key()), "files": _files(directory)}
    body = json.dumps(manifest, indent=2, sort_keys=True).encode()
    (directory / MANIFEST).write_bytes(body)
    (directory / SIGNATURE).write_bytes(base64.b64encode(private_key.sign(body)))
    return manifest


def verify_directory(directory: Path, public_key: Ed25519PublicKey) -> dict:
    """The manifest of `directory` once its signature and every file check out; ManifestError (one line) otherwise."""
    manifest_path, signature_path = directory / MANIFEST, directory / SIGNATURE
    if not manifest_path.is_file() or not signature_path.is_file():
        raise ManifestError("it has no signed manifest (manifest.json and manifest.sig); register it again with the pipeline")
    body = manifest_path.read_bytes()
    try:
        public_key.verify(base64.b64decode(signature_path.read_bytes(), validate=True), body)
    except (InvalidSignature, ValueError):
        signer = _declared_key(body)
        raise ManifestError(f"its manifest signature is not valid for the trusted key {key_id(public_key)} "
                            f"(the manifest names key {signer})") from None
    manifest = json.loads(body)
    expected, actual = manifest["files"], _files(directory)
    for name in sorted(expected.keys() | actual.keys()):
        if name not in actual:
            raise ManifestError(f"{name} is listed in its signed manifest but missing")
        if name not in expected:
            raise ManifestError(f"{name} is not in its signed manifest")
        if actual[name] != expected[name]:
            raise ManifestError(f"{name} has sha256 {actual[name][:16]}..., its signed manifest says {expected[name][:16]}...")
    return manifest


def _declared_key(body: bytes) -> str:
    try:
        return str(json.loads(body).get("key_id", "unknown"))
    except (ValueError, AttributeError):
        return "unknown (the manifest is not valid JSON)"
