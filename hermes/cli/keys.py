"""``hermes keys``: API keys per tenant (hashed in an auth file or Redis) and CURVE keys.

- ``hermes keys create --tenant T [--auth-file FILE | --redis URL]`` prints a new key once and
  stores only its scrypt hash;
- ``hermes keys list`` / ``hermes keys revoke ID``;
- ``hermes keys limits --tenant T --rate R --burst B --max-concurrent N --max-active-runs N
  --rpm N``;
- ``hermes keys curve --dir DIR --node NAME ... --edge NAME ...``: ZeroMQ CURVE certificates
  for the scheduler, its HermesLets and its edges (:mod:`hermes.security.curve`).
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from hermes.cliout import print_json, print_table

DEFAULT_AUTH_FILE = "hermes-auth.json"


def _store(args: argparse.Namespace):  # noqa: ANN202
    from hermes.gateway.keys import FileKeyStore, RedisKeyStore

    if args.redis:
        return RedisKeyStore(args.redis)
    return FileKeyStore(args.auth_file)


def cmd_create(args: argparse.Namespace) -> int:
    key = _store(args).create(args.tenant)
    where = args.redis or args.auth_file
    print(f"new API key for tenant {args.tenant!r} (stored hashed in {where}; shown only once):",
          file=sys.stderr)
    print(key)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    print_table([{"id": e.id, "tenant": e.tenant,
                  "created": datetime.fromtimestamp(e.created, UTC).strftime("%Y-%m-%d %H:%M:%S")}
                 for e in _store(args).entries()], title="API keys", empty="(no keys)")
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    if not _store(args).revoke(args.id):
        print(f"hermes keys: no key with id {args.id!r}", file=sys.stderr)
        return 1
    print(f"revoked {args.id}", file=sys.stderr)
    return 0


def cmd_limits(args: argparse.Namespace) -> int:
    limits = {k: v for k, v in (("rate", args.rate), ("burst", args.burst),
                                ("max_concurrent", args.max_concurrent),
                                ("max_active_runs", args.max_active_runs),
                                ("rpm", args.rpm)) if v is not None}
    _store(args).set_limits(args.tenant, limits)
    print_json({args.tenant: limits})
    return 0


def cmd_curve(args: argparse.Namespace) -> int:
    from hermes.security.curve import create_curve_keys

    made = create_curve_keys(args.dir, args.node or [], args.edge or [])
    for role, path in made.items():
        print(f"{role}: {path}")
    if not made:
        print("nothing new (the server certificate exists; give --node NAME or --edge NAME)",
              file=sys.stderr)
    return 0


def add_keys_parser(sub: argparse._SubParsersAction) -> None:
    k = sub.add_parser("keys", help="API keys per tenant (hashed) and ZeroMQ CURVE keys")
    ksub = k.add_subparsers(dest="keys_cmd", required=True)

    def store_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--auth-file", dest="auth_file", default=DEFAULT_AUTH_FILE,
                       help="JSON auth file (default %(default)s)")
        p.add_argument("--redis", help="keep the keys in Redis (redis://HOST:PORT/DB) instead")

    s = ksub.add_parser("create", help="create an API key for a tenant; prints it once")
    s.add_argument("--tenant", required=True)
    store_args(s)
    s.set_defaults(func=cmd_create)
    s = ksub.add_parser("list", help="key ids and tenants (never the keys)")
    store_args(s)
    s.set_defaults(func=cmd_list)
    s = ksub.add_parser("revoke", help="revoke a key by id")
    s.add_argument("id")
    store_args(s)
    s.set_defaults(func=cmd_revoke)
    s = ksub.add_parser("limits", help="set a tenant's rate limit and quotas")
    s.add_argument("--tenant", required=True)
    s.add_argument("--rate", type=float, help="requests per second (token bucket)")
    s.add_argument("--burst", type=float)
    s.add_argument("--max-concurrent", dest="max_concurrent", type=int)
    s.add_argument("--max-active-runs", dest="max_active_runs", type=int)
    s.add_argument("--rpm", type=int,
                   help="requests in any 60 s (exact sliding window; with [cluster] store, "
                        "over every gateway process together)")
    store_args(s)
    s.set_defaults(func=cmd_limits)
    s = ksub.add_parser("curve", help="CURVE certificates for the scheduler, HermesLets "
                        "and edges")
    s.add_argument("--dir", required=True, help="certificate directory (security.curve_dir)")
    s.add_argument("--node", action="append", help="make a certificate for this node (repeatable)")
    s.add_argument("--edge", action="append",
                   help="make a certificate for this edge, --role edge (repeatable)")
    s.set_defaults(func=cmd_curve)
