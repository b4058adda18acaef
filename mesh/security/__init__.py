"""Security: who may connect (CURVE keys, the ZAP handler) and what each principal may do (ACLs).

- ``mesh.security.creds``: creds files and the broker's secrets directory (keys on disk);
- ``mesh.security.zap``: the ZAP decision (pure) and the node's ZAP handler (answered in the
  node loop: no thread), which also caps the number of connections;
- ``mesh.security.acl`` / ``registry`` / ``authorizer``: users, ACL rows and their evaluation.

Clients take ``creds=`` (a path or a ``Creds``; None: $MESH_CREDS; else an open cluster).
"""
from mesh.security.creds import (BROKER_PRINCIPAL, CREDS_ENV, Creds, CredsError, Secrets, init_secrets,
                                 load_creds)

__all__ = ["Creds", "CredsError", "Secrets", "load_creds", "init_secrets", "CREDS_ENV", "BROKER_PRINCIPAL"]
