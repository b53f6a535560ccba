"""The admin app's only door to the config database.

Every policy change goes through :class:`sluice.policies.service.PolicyService`, the same
code the HTTP API and the CLI run, so a change made here is validated, versioned and refused
when stale exactly as it would be there. Roles are enforced here, not only by hiding buttons:
a viewer's session cannot publish even if the UI were bypassed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from sluice.clock import Clock
from sluice.db import Database
from sluice.errors import DomainNotFoundError, SluiceError
from sluice.model import DomainPolicy
from sluice.policies.service import DomainView, PolicyService, Version
from sluice.policies.store import PolicyStore
from sluice.policies.yaml_format import DEFAULT_MAX_LOG_LIMIT
from sluice.usage.store import SECOND, KeyRecord, UsagePoint, UsageStore
from sluice_admin.accounts import AccountStore, UserChangeEntry
from sluice_admin.auth import Account, Role, User
from sluice_admin.draft_store import DraftStore
from sluice_admin.pending import pending_text
from sluice_admin.session_store import SessionStore
from sluice_admin.users import UserChange, a_role

__all__ = ["AdminData", "NotAllowedError"]

# The source name validation messages carry for a policy edited in the app ("pending:12: …").
PENDING_SOURCE = "pending"


class NotAllowedError(SluiceError):
    """The signed-in user's role does not allow this change."""


class AdminData:
    def __init__(self, database: Database, *, max_log_limit: int = DEFAULT_MAX_LOG_LIMIT) -> None:
        # Peers on one database: policies (through the service), usage, accounts, and the
        # app's own sessions and pending edits (which no role check guards: every user has
        # their own).
        self._db = database
        self._max_log_limit = max_log_limit
        self._policies = PolicyService(PolicyStore(database), max_log_limit=max_log_limit)
        self._usage = UsageStore(database)
        self._accounts = AccountStore(database)
        self.sessions = SessionStore(database)
        self.drafts = DraftStore(database)

    @classmethod
    def open(cls, url: str, *, max_log_limit: int = DEFAULT_MAX_LOG_LIMIT) -> AdminData:
        """Connect and bring the schema up to date; ConfigDatabaseError if unreachable."""
        database = Database(url)
        database.upgrade()
        return cls(database, max_log_limit=max_log_limit)

    def close(self) -> None:
        self._db.close()

    # -- policies: reading -------------------------------------------------------------------

    def domains(self) -> list[DomainView]:
        return self._policies.domains()

    def get(self, domain: str) -> DomainView | None:
        try:
            return self._policies.get(domain)
        except DomainNotFoundError:
            return None

    def history(self, domain: str) -> list[Version]:
        try:
            return self._policies.history(domain)
        except DomainNotFoundError:
            return []

    def diff(self, domain: str, from_version: int, to_version: int) -> str:
        """Unified diff of one version's document against another's."""
        return self._policies.diff(domain, from_version, to_version)

    def validate_descriptors(
        self, domain: str, descriptors: list[dict[str, object]]
    ) -> DomainPolicy:
        """A domain's rules (as YAML mappings) through the server's loader; ConfigError with
        the loader's own messages, lines counted in :func:`pending_text`'s output.

        The rules are what the editor changes: the live domain's own settings (its
        ``limit_overrides``) and its operators' pins and resets come along unchanged, so the
        diff shows the rules' change alone and a publish keeps them (without this, it dropped
        ``limit_overrides`` and the diff showed every pin removed)."""
        policy = self.validate_document(pending_text(domain, descriptors), PENDING_SOURCE)[0]
        live = self.get(domain)
        if live is None:
            return policy
        return dataclasses.replace(
            policy,
            limit_overrides=live.policy.limit_overrides,
            pins=live.policy.pins,
            resets=live.policy.resets,
        )

    def validate_document(self, text: str, source: str) -> list[DomainPolicy]:
        return self._policies.validate([(source, text)])

    # -- policies: changing (editors only) ---------------------------------------------------

    def publish(
        self, user: User, policy: DomainPolicy, *, base_version: int, comment: str
    ) -> int | None:
        """The new version, or None when the rules equal the live ones; StaleVersionError
        when someone else published since ``base_version`` (0: the domain must be new)."""
        _require_editor(user, "publish")
        changed = self._policies.publish(
            [policy],
            author=user.name,
            comment=comment,
            base_versions={policy.domain: base_version},
        )
        return changed.get(policy.domain)

    def rollback(
        self, user: User, domain: str, to_version: int, *, base_version: int, comment: str = ""
    ) -> int | None:
        _require_editor(user, "roll back")
        return self._policies.rollback(
            domain, to_version, author=user.name, comment=comment, base_version=base_version
        )

    def import_document(
        self, user: User, text: str, source: str, *, comment: str
    ) -> dict[str, int]:
        """Validate every domain in ``text`` first, then publish them together."""
        _require_editor(user, "import")
        policies = self._policies.validate([(source, text)])
        return self._policies.publish(policies, author=user.name, comment=comment)

    # -- overrides, blocks, allows and resets of one descriptor (editors only) ---------------
    # The CLI's and the write API's own calls: each change is a version in the History.

    def put_pin(
        self,
        user: User,
        domain: str,
        kind: str,
        descriptor: str,
        *,
        rate_limit: Mapping[str, object] | None = None,
        expires_in: str | None = None,
        comment: str,
        clock: Clock,
    ) -> int | None:
        """Pin ``descriptor`` (``KEY=VALUE,…``) as ``kind`` (overrides, blocks, allows),
        expiring ``expires_in`` from ``clock``'s now; the new version (None: unchanged)."""
        _require_editor(user, f"change {kind}")
        service = PolicyService(
            self._policies.store, max_log_limit=self._max_log_limit, clock=clock
        )
        changed = service.put_pin(
            domain,
            kind,
            descriptor,
            rate_limit=rate_limit,
            expires_in=expires_in,
            author=user.name,
            comment=comment,
        )
        return changed.get(domain)

    def delete_pin(
        self, user: User, domain: str, kind: str, descriptor: str, *, comment: str
    ) -> int | None:
        _require_editor(user, f"change {kind}")
        changed = self._policies.delete_pin(
            domain, kind, descriptor, author=user.name, comment=comment
        )
        return changed.get(domain)

    def reset(self, user: User, domain: str, descriptor: str, *, comment: str) -> int | None:
        """Start ``descriptor``'s counters afresh on every server; the new version."""
        _require_editor(user, "reset counters")
        changed = self._policies.reset(domain, descriptor, author=user.name, comment=comment)
        return changed.get(domain)

    # -- usage telemetry ---------------------------------------------------------------------

    def usage(
        self, domain: str, *, since_s: int, resolution_s: int = SECOND
    ) -> dict[str, list[UsagePoint]]:
        """Per rule id of ``domain`` (``domain.key_value…``): points since ``since_s``."""
        return self._usage.series(f"{domain}.", since_s=since_s, resolution_s=resolution_s)

    def usage_of(
        self, rule_id: str, *, since_s: int, resolution_s: int = SECOND
    ) -> list[UsagePoint]:
        """One rule's points (not those of the rules nested under it)."""
        series = self._usage.series(rule_id, since_s=since_s, resolution_s=resolution_s)
        return series.get(rule_id, [])

    def key_record(self, rule_id: str, *, since_s: int, resolution_s: int = SECOND) -> KeyRecord:
        """One rule's usage per key (its heaviest keys by name, the rest as a histogram)."""
        return self._usage.key_record(rule_id, since_s=since_s, resolution_s=resolution_s)

    def top_offenders(self, rule_id: str, *, since_s: int) -> list[tuple[str, int]]:
        return self._usage.top_offenders(rule_id, since_s=since_s)

    # -- users -------------------------------------------------------------------------------

    def accounts(self) -> dict[str, Account]:
        return self._accounts.all()

    def save_account(self, account: Account, *, actor: str) -> bool:
        """Create or replace a user (``sluice admin-user add``); True if it was new."""
        return self._accounts.save(account, actor=actor)

    def change_user(self, user: User, change: UserChange, *, setting: Mapping[str, Role]) -> None:
        """Add, remove, re-role or set the password of a user stored in the database, as
        ``user`` (who must be an admin, as the database and ``setting`` say now); audited."""
        if not user.can_manage_users:
            raise NotAllowedError(f"{user.name} is {a_role(user.role)}: only admins manage users")
        self._accounts.change(change, actor=user.name, setting=setting)

    def user_changes(self) -> list[UserChangeEntry]:
        return self._accounts.changes()


def _require_editor(user: User, action: str) -> None:
    if not user.can_edit:
        raise NotAllowedError(f"{user.name} is a {user.role.value}: only editors may {action}")
