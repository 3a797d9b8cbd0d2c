"""The reconciler's Slurm token, read from its Secret through the API server.

A Slinky ``Token`` mints its JWT where the signing key lives: slurm-operator v1.2.1 resolves the
Token's ``jwtKeyRef`` and writes its ``secretRef`` in the Token's own namespace
(api/v1beta1/token_keys.go, internal/builder/common/token_secret.go). The stack keeps both in the
Slurm namespace, so the key is never copied to the reconciler's; a pod mounts only Secrets of its
own namespace, so the reconciler reads the minted token with `get` on that one Secret
(components/slinky.py token_reader_rules) and nothing else there.
"""
from __future__ import annotations

import base64
import time
from dataclasses import dataclass

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpufleet.reconciler.adapters.slurm import SlurmError
from gpufleet.reconciler.adapters.slurm.rest import KeptToken

__all__ = ["SecretRef", "SecretToken", "TokenNudge"]


@dataclass(frozen=True)
class SecretRef:
    namespace: str
    name: str
    key: str = "SLURM_JWT"

    @classmethod
    def parse(cls, text: str) -> "SecretRef":
        """`NAMESPACE/NAME[/KEY]`, as the `--slurm-token-secret` flag takes it; ValueError names the flag."""
        parts = text.split("/")
        if len(parts) not in (2, 3) or not all(parts):
            raise ValueError(f"--slurm-token-secret: {text!r} is not NAMESPACE/NAME[/KEY]")
        return cls(*parts)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class SecretToken(KeptToken):
    """The token in a Secret that the Token's controller keeps fresh, read through the API server."""

    def __init__(self, api: client.ApiClient, ref: SecretRef, clock=time.time):
        super().__init__(clock)
        self.core = client.CoreV1Api(api)
        self.ref = ref

    def describe(self) -> str:
        return f"Secret {self.ref} key {self.ref.key}"

    def _fetch(self) -> str:
        try:
            secret = self.core.read_namespaced_secret(self.ref.name, self.ref.namespace, _request_timeout=10)
        except ApiException as e:
            # 404: the Token's controller has not written it yet; 403: the Role is missing. Both are
            # the platform's to fix and may be fixed while we wait, so neither ends the remediation.
            raise SlurmError(f"Slurm REST: cannot read the token's {self.describe()}: HTTP {e.status} "
                             f"{e.reason}", temporary=True) from None
        except Exception as e:  # noqa: BLE001 - the API server unreachable or slow
            raise SlurmError(f"Slurm REST: cannot read the token's {self.describe()}: {type(e).__name__}",
                             temporary=True) from None
        raw = (secret.data or {}).get(self.ref.key)
        text = base64.b64decode(raw).decode(errors="replace").strip() if raw else ""
        if not text:
            raise SlurmError(f"Slurm REST: the token's {self.describe()} is empty", temporary=True)
        return text


class TokenNudge:
    """Writes the reconciler's condition onto its Slinky Token (one annotation, a JSON merge patch), the
    change that makes slurm-operator reconcile the Token again (reconciler/core/slurm_token.py says why).
    Its rights: `patch` on that one Token by name (components/slinky.py token_reader_rules), and the stack's
    admission policy lets that patch change this annotation only (components/admission.py)."""

    GROUP, VERSION, PLURAL = "slinky.slurm.net", "v1beta1", "tokens"

    def __init__(self, api: client.ApiClient, namespace: str, name: str):
        self.custom = client.CustomObjectsApi(api)
        self.namespace, self.name = namespace, name

    def __call__(self, condition: dict) -> None:
        """Raises SlurmError (temporary) when the API server refuses or cannot be reached."""
        import json

        from gpufleet.fleetspec import labels

        body = {"metadata": {"annotations": {labels.TOKEN_NUDGE: json.dumps(condition, sort_keys=True)}}}
        try:
            # a dict body goes as application/merge-patch+json (kubernetes-client CustomObjectsApi: json-patch
            # only for a list), so nothing but this annotation is sent
            self.custom.patch_namespaced_custom_object(self.GROUP, self.VERSION, self.namespace, self.PLURAL,
                                                       self.name, body, _request_timeout=10)
        except ApiException as e:
            raise SlurmError(f"cannot annotate Token {self.namespace}/{self.name}: HTTP {e.status} {e.reason}",
                             temporary=True) from None
        except Exception as e:  # noqa: BLE001 - the API server unreachable or slow
            raise SlurmError(f"cannot annotate Token {self.namespace}/{self.name}: {type(e).__name__}",
                             temporary=True) from None
