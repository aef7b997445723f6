"""The serving certificate of the API server's HTTPS port.

kubectl (client-go) sends a kubeconfig's or ``--token``'s credentials only over TLS: against the
plain-HTTP URL it sends none, which the devcluster takes for its admin.  So ServiceAccount
kubeconfigs point at the HTTPS port, with this self-signed certificate (valid for the loopback
names, made at start, kept in memory) as their ``certificate-authority-data``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class ServingCert:
    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def self_signed(cls, days: int = 30) -> ServingCert:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "devcluster-apiserver")])
        now = datetime.datetime.now(datetime.UTC)
        names = [
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("::1")),
        ]
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return cls(cert.public_bytes(serialization.Encoding.PEM), key_pem)

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        # load_cert_chain reads files only: write them where only this user can read, briefly
        with tempfile.TemporaryDirectory(prefix="devcluster-tls-") as folder:
            cert, key = os.path.join(folder, "tls.crt"), os.path.join(folder, "tls.key")
            for path, data in ((cert, self.cert_pem), (key, self.key_pem)):
                with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as out:
                    out.write(data)
            context.load_cert_chain(cert, key)
        return context
