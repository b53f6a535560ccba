"""The ``sluice admin`` and ``sluice admin-user`` commands.

The ``sluice`` command finds them through the ``sluice.commands`` entry point group (see
pyproject.toml), so the server never imports the admin package. This module is imported on
every ``sluice`` run, with or without the ``admin`` extra: it must not import Streamlit, and
``sluice admin`` checks that the extra is there before handing over to Streamlit.
"""

from __future__ import annotations

import argparse
import getpass
import importlib.util
import os
import sys

from sluice.errors import SluiceError
from sluice.settings import Settings, add_arguments, env_name

__all__ = ["INSTALL_HINT", "add_commands"]

INSTALL_HINT = "pip install 'sluice[admin]'"

# What the admin app reads (through SLUICE_* variables, see _admin).
_ADMIN_SETTINGS = (
    "database_url",
    "admin_users",
    # The Leases and RLQS pages ask these servers, with the API token.
    "admin_servers",
    "api_token",
    "admin_session_idle_timeout_s",
    "admin_session_lifetime_s",
    "admin_session_secret",
    "admin_oidc_metadata_url",
    "admin_oidc_client_id",
    "admin_oidc_client_secret",
    "admin_oidc_redirect_uri",
    "admin_oidc_role_claim",
    "admin_oidc_roles",
    "max_sliding_log_limit",
    "log_level",
    # The sign-in throttle decides with the server's backend (shared when it is Redis).
    "backend",
    "redis_url",
    "redis_key_prefix",
    "redis_timeout_ms",
    "redis_tls_ca_file",
    "redis_tls_cert_file",
    "redis_tls_key_file",
    # HTTPS for the app itself (Streamlit cannot ask browsers for client certificates).
    "tls_cert_file",
    "tls_key_file",
)
# Largest policy file the Import page takes; Streamlit refuses bigger uploads itself.
ADMIN_MAX_UPLOAD_MB = 1

# The third-party modules the app imports: the ``admin`` extra.
_APP_MODULES = ("streamlit", "pandas", "altair")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``admin`` and ``admin-user`` to the ``sluice`` command's subcommands."""
    admin = sub.add_parser("admin", help="run the admin web app (Streamlit)")
    admin.add_argument("--port", type=int, default=8501, help="HTTP port [default: 8501]")
    admin.add_argument("--address", default=None, help="address to bind [default: all]")
    add_arguments(admin, only=_ADMIN_SETTINGS)
    admin.set_defaults(handler=_admin)

    admin_user = sub.add_parser("admin-user", help="manage admin app users")
    users = admin_user.add_subparsers(dest="admin_user_command", metavar="ACTION", required=True)
    add_user = users.add_parser(
        "add", help="create or update a user; the password is read from stdin or a prompt"
    )
    add_user.add_argument("name", metavar="NAME")
    add_user.add_argument("--role", choices=("viewer", "editor", "admin"), required=True)
    add_user.add_argument(
        "--print",
        action="store_true",
        dest="print_only",
        help="print a NAME:ROLE:HASH entry for SLUICE_ADMIN_USERS instead of storing the user",
    )
    add_arguments(add_user, only=("database_url", "log_level"))
    add_user.set_defaults(handler=_admin_user_add)


def _admin(args: argparse.Namespace, settings: Settings) -> int:
    # Checked here, not left to the exec below: without the extra, Streamlit would fail with a
    # traceback rather than say what to install.
    missing = [name for name in _APP_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise SluiceError(
            f"the admin app is not installed (no {', '.join(missing)}): {INSTALL_HINT}"
        )
    from sluice_admin import SERVED_PATH
    from sluice_admin.oidc import oidc_config

    try:
        oidc_config(settings)  # a misconfigured single sign-on stops here, named
    except ValueError as exc:
        raise SluiceError(str(exc)) from None
    env = dict(os.environ)
    for name in _ADMIN_SETTINGS:
        env[env_name(name)] = str(getattr(settings, name))
    command = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(SERVED_PATH),
        "--server.port",
        str(args.port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        # No "Deploy" button or developer menu: this is an operator's tool, not a demo.
        "--client.toolbarMode",
        "minimal",
        "--server.maxUploadSize",
        str(ADMIN_MAX_UPLOAD_MB),
        "--server.enableXsrfProtection",
        "true",
        *(
            ["--server.sslCertFile", settings.tls_cert_file]
            + ["--server.sslKeyFile", settings.tls_key_file]
            if settings.tls_cert_file
            else []
        ),
        *(["--server.address", args.address] if args.address else []),
    ]
    sys.stdout.flush()
    # exec: signals (Ctrl-C, SIGTERM from a supervisor) reach Streamlit directly.
    os.execve(sys.executable, command, env)
    return 0  # not reached


def _admin_user_add(args: argparse.Namespace, settings: Settings) -> int:
    # Imported here: this module is loaded on every ``sluice`` run. Neither needs Streamlit,
    # so users can be created (or printed for SLUICE_ADMIN_USERS) with the server alone.
    from sluice_admin.auth import Account, Role, hash_password
    from sluice_admin.users import UserChangeError, check_name, check_password

    try:
        name = check_name(args.name)
    except UserChangeError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 2
    password = _read_password()
    try:
        check_password(password)
    except UserChangeError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
    account = Account(name, Role(args.role), hash_password(password))
    if args.print_only:
        print(f"{account.name}:{account.role.value}:{account.password_hash}")
        return 0
    from sluice_admin.data import AdminData

    data = AdminData.open(settings.database_url)
    try:
        # The audit trail names who ran the command, as the system knows them.
        created = data.save_account(account, actor=f"{getpass.getuser()} (sluice admin-user)")
    finally:
        data.close()
    print(f"{name}: {'created' if created else 'updated'} ({args.role})")
    return 0


def _read_password() -> str:
    if not sys.stdin.isatty():
        return sys.stdin.readline().rstrip("\r\n")
    first = getpass.getpass("Password: ")
    if getpass.getpass("Again: ") != first:
        raise SluiceError("the passwords differ")
    return first
