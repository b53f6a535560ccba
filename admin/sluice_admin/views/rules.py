"""Rules: the domain's descriptor tree, edited as a pending change, diffed, then published.

The pending policy is the user's, kept in the config database (draft_store.py) until it is
published or discarded: a reload, another tab or another browser shows the same one. Every edit is
validated by the server's own loader at once, so the messages shown are the server's.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import streamlit as st
import yaml

from sluice.algorithms import ALGORITHMS, DEFAULT_ALGORITHM
from sluice.errors import ConfigError, StaleVersionError
from sluice.model import DomainPolicy, Rule, Unit
from sluice.policies.descriptor_text import format_duration
from sluice_admin import pending, session
from sluice_admin.auth import User
from sluice_admin.data import AdminData, NotAllowedError
from sluice_admin.draft_store import StoredDraft
from sluice_admin.pending import (
    LIMIT,
    NO_LIMIT,
    UNLIMITED,
    LimitFields,
    RuleForm,
    RulePath,
    rule_id,
)

UNITS = [u.name.lower() for u in Unit if u is not Unit.UNKNOWN]
MODES = {LIMIT: "limited", UNLIMITED: "unlimited", NO_LIMIT: "no limit (placeholder or whitelist)"}
_FORM = "rules_form_target"
_NEW_DOMAINS = "rules_new_domains"
_NOTICE = "rules_notice"


@dataclass(frozen=True)
class Draft:
    """One domain's pending edit: the rules, and the live version they started from."""

    policy: DomainPolicy
    base_version: int  # 0: the domain does not exist yet
    loaded: DomainPolicy | None  # the live rules when loaded; None for a new domain


@dataclass(frozen=True)
class FormTarget:
    parent: RulePath  # where the rule goes
    old: RulePath | None  # the rule being edited; None: adding


def _key(domain: str) -> str:
    return f"rules_draft:{domain}"


def _stale_key(domain: str) -> str:
    # Per domain: a refused publish of one domain says nothing about another.
    return f"rules_stale:{domain}"


def _set_draft(draft: Draft | None, domain: str) -> None:
    """Replace (None: drop) the user's pending edit of ``domain``, in the database and in this
    session's copy. Whatever replaces it was made after a refused publish, so the
    stale-version message no longer applies."""
    kept = _stored(draft) if draft is not None else None
    user = session.current_user().name
    if kept is None:
        session.data().drafts.drop(user, domain)
        st.session_state.pop(_key(domain), None)
    else:
        session.data().drafts.put(user, kept)
        st.session_state[_key(domain)] = draft
    st.session_state.pop(_stale_key(domain), None)


def _stored(d: Draft) -> StoredDraft | None:
    """``d`` as the database keeps it; None when it changes nothing (nothing to keep)."""
    if d.policy == d.loaded or (d.loaded is None and not d.policy.descriptors):
        return None
    domain = d.policy.domain
    return StoredDraft(
        domain,
        d.base_version,
        pending.pending_text(domain, pending.document_rules(d.policy)),
        pending.pending_text(domain, pending.document_rules(d.loaded)) if d.loaded else None,
    )


def _restored(data: AdminData, kept: StoredDraft) -> Draft | None:
    """A kept pending edit validated again (the live domain's pins come along, as for any
    edit); None, with the loader's words, if it no longer passes."""

    def rules(text: str) -> DomainPolicy:
        docs = (yaml.safe_load(text) or {}).get("descriptors") or []
        return data.validate_descriptors(kept.domain, docs)

    try:
        policy = rules(kept.rules)
        loaded = rules(kept.loaded) if kept.loaded is not None else None
    except ConfigError as exc:
        st.warning(f"Your pending edit of {session.escape(kept.domain)} no longer validates.")
        show_problems(exc, kept.rules)
        return None
    return Draft(policy, kept.base_version, loaded)


def draft(data: AdminData, domain: str) -> Draft:
    """The user's pending edit of ``domain``, kept in the database so a reload, another tab or
    another browser shows the same one; the live version when there is nothing pending, so
    an untouched page follows other people's publishes."""
    kept = data.drafts.get(session.current_user().name, domain)
    cached: Draft | None = st.session_state.get(_key(domain))
    if kept is not None:
        if cached is not None and _stored(cached) == kept:
            return cached  # unpublished edits: kept, even if the live version moved on
        restored = _restored(data, kept)
        if restored is not None:
            st.session_state[_key(domain)] = restored
            return restored
    live = data.get(domain)
    fresh = (
        Draft(live.policy, live.version, live.policy)
        if live is not None
        else Draft(DomainPolicy(domain), 0, None)
    )
    st.session_state[_key(domain)] = fresh
    return fresh


def render() -> None:
    st.title("Rules")
    data = session.data()
    user = session.current_user()
    with session.guarded():
        live = [d.domain for d in data.domains()]
        # New domains: named in this session, or with rules pending from before.
        kept = [d.domain for d in data.drafts.all(user.name) if d.base_version == 0]
        named = st.session_state.get(_NEW_DOMAINS, [])
        extra = [d for d in dict.fromkeys([*named, *kept]) if d not in live]
        domain = session.choose_domain(sorted([*live, *extra]))
        if user.can_edit:
            _new_domain(live)
        if domain is None:
            st.info("No domains yet." + (" Create one above." if user.can_edit else ""))
            return
        _page(data, user, domain)


def _new_domain(live: list[str]) -> None:
    with st.expander("New domain"):
        name = st.text_input("Domain name", key="rules_new_domain").strip()
        if st.button("Create", key="rules_create_domain", disabled=not name):
            if name in live:
                st.error("That domain exists already; pick it in the sidebar.")
                return
            st.session_state.setdefault(_NEW_DOMAINS, []).append(name)
            session.show_domain(name)
            st.rerun()


def _page(data: AdminData, user: User, domain: str) -> None:
    d = draft(data, domain)
    notice = st.session_state.pop(_NOTICE, None)
    if notice:
        st.success(notice)  # built with escaped user data
    version = f"live version {d.base_version}" if d.base_version else "not published yet"
    changed = d.policy != d.loaded
    st.caption(
        f"Domain {session.escape(domain)}: {version}"
        + (" · unpublished changes" if changed else "")
    )
    # A key keeps the chosen tab across reruns (a publish button must not vanish under you).
    tree, yaml_tab, diff_tab = st.tabs(["Tree", "YAML", "Pending change"], key="rules_tabs")
    with tree:
        _tree(data, user, d)
    with yaml_tab:
        _yaml(data, user, d)
    with diff_tab:
        _publish(data, user, d)


# -- the tree and its actions ------------------------------------------------------------------


def _summary(rule: Rule) -> str:
    if rule.unlimited:
        text = "unlimited"
    elif rule.concurrency is not None:
        ttl = format_duration(rule.concurrency.lease_ttl_s)
        text = f"{rule.concurrency.max_leases} at once (leases of {ttl})"
    elif rule.limits:
        parts = []
        for limit in rule.limits:
            default = ALGORITHMS[limit.algorithm] is DEFAULT_ALGORITHM
            extra = [] if default else [limit.algorithm]
            if limit.burst is not None:
                extra.append(f"burst {limit.burst}")
            more = f" ({', '.join(extra)})" if extra else ""
            if limit.requests_per_unit == 0:  # nothing passes, whatever the unit
                parts.append(f"blocked{more}")
            else:
                parts.append(f"{limit.requests_per_unit} / {limit.unit.name.lower()}{more}")
        text = " and ".join(parts)
    else:
        text = "no limit" if rule.descriptors else "whitelisted (no limit)"
    flags = [f for f in ("shadow_mode", "share_threshold") if getattr(rule, f)]
    if rule.name:
        flags.append(f"name {rule.name}")
    if rule.replaces:
        flags.append("replaces " + ", ".join(rule.replaces))
    return text + (f"  [{'; '.join(flags)}]" if flags else "")


def _tree(data: AdminData, user: User, d: Draft) -> None:
    rows = pending.rows(d.policy)
    if not rows:
        st.info("This domain has no rules yet." + (" Add one below." if user.can_edit else ""))
    for index, row in enumerate(rows):
        # Wide enough for "Duplicate" in full at 1400 px (at [8, 1, 1, 1] it read "Dupli…").
        label, edit, dup, delete = st.columns([6, 1, 1.5, 1.1], vertical_alignment="center")
        # st.text: keys and values are user data and shown exactly, never as Markdown.
        label.text("    " * row.depth + f"{row.label}: {_summary(row.rule)}")
        if not user.can_edit:
            continue
        if edit.button("Edit", key=f"rules_edit_{index}"):
            _open_form(FormTarget(row.path[:-1], row.path), pending.form_from_rule(row.rule))
        if dup.button("Duplicate", key=f"rules_dup_{index}"):
            copy = pending.form_from_rule(row.rule)
            copy.value = (copy.value + "_copy") if copy.value else copy.value
            copy.name = ""
            _open_form(FormTarget(row.path[:-1], None), copy)
        if delete.button("Delete", key=f"rules_delete_{index}"):
            docs = pending.remove_rule(pending.document_rules(d.policy), row.path)
            if apply_edit(data, d, docs):  # refused, e.g., when another rule replaces it
                removed = session.escape(row.label)
                st.session_state[_NOTICE] = f"Removed {removed} from the pending change."
                st.rerun()
    if not user.can_edit:
        st.caption("You are a viewer: rules can be looked at, not changed.")
        return
    parents = {"(top level)": ()} | {f"under {r.label}": r.path for r in rows}
    left, right = st.columns([3, 1], vertical_alignment="bottom")
    where = left.selectbox("Add a rule", list(parents), key="rules_add_parent")
    if right.button("Add rule", key="rules_add"):
        _open_form(FormTarget(parents[where], None), RuleForm())
    target: FormTarget | None = st.session_state.get(_FORM)
    if target is not None:
        _form(data, d, target)


def _open_form(target: FormTarget, form: RuleForm) -> None:
    st.session_state[_FORM] = target
    st.session_state.pop(_FORM_SHOWN, None)
    first = form.limits[0]
    second = form.limits[1] if len(form.limits) > 1 else LimitFields()
    values = {
        "rf_key": form.key,
        "rf_value": form.value,
        "rf_mode": form.mode,
        "rf_rpu": first.requests_per_unit,
        "rf_unit": first.unit,
        "rf_alg": first.algorithm,
        "rf_burst": first.burst,
        "rf_two": len(form.limits) > 1,
        "rf_rpu2": second.requests_per_unit,
        "rf_unit2": second.unit,
        "rf_alg2": second.algorithm,
        "rf_burst2": second.burst,
        "rf_name": form.name,
        "rf_replaces": ", ".join(form.replaces),
        "rf_shadow": form.shadow_mode,
        "rf_flags": (form.detailed_metric, form.share_threshold),
    }
    st.session_state.update(values)
    st.session_state[_FORM_KEPT] = {k: v for k, v in values.items() if k in _SHAPE_FIELDS}
    st.rerun()


def _limit_fields(suffix: str) -> None:
    a, b, c, e = st.columns(4)
    a.number_input("Requests per unit", min_value=0, step=1, key=f"rf_rpu{suffix}")
    b.selectbox("Unit", UNITS, key=f"rf_unit{suffix}")
    c.selectbox("Algorithm", list(ALGORITHMS), key=f"rf_alg{suffix}")
    e.number_input(
        "Burst",
        min_value=0,
        step=1,
        key=f"rf_burst{suffix}",
        help="token_bucket, leaky_bucket, gcra: capacity; empty: the limit itself",
    )


_FORM_KEPT = "rules_form_kept"  # the shape-dependent fields' values, shown or not
_FORM_SHOWN = "rules_form_shown"  # which of them the last run drew
_SHAPE_FIELDS = ("rf_two",) + tuple(
    f"rf_{name}{suffix}" for suffix in ("", "2") for name in ("rpu", "unit", "alg", "burst")
)


def _shape_fields_shown(limited: bool, two: bool) -> set[str]:
    if not limited:
        return set()
    return {"rf_two"} | {f for f in _SHAPE_FIELDS if f[-1] != "2" or two}


def _restore_shape_fields(limited: bool) -> bool:
    """Streamlit forgets (or resets) a widget's value once a run does not draw it, so the
    fields the rule's shape hides are kept aside and put back when shown again. Whether the
    rule has a second limit."""
    s = st.session_state
    kept: dict[str, object] = s[_FORM_KEPT]
    before: set[str] = s.get(_FORM_SHOWN, set())
    for name in before & s.keys():
        kept[name] = s[name]
    two = limited and bool(kept["rf_two"])
    shown = _shape_fields_shown(limited, two)
    for name in shown - before:
        s[name] = kept[name]
    s[_FORM_SHOWN] = shown
    return two


def _form(data: AdminData, d: Draft, target: FormTarget) -> None:
    parent = rule_id(d.policy.domain, target.parent) if target.parent else None
    where = f"under {parent}" if parent else "top level"
    title = "Edit rule" if target.old is not None else "New rule"
    with st.container(border=True):
        st.subheader(title, anchor=False)
        st.text(f"Position: {where}")
        # The rule's shape, outside the form: choosing it redraws the form with only the fields
        # that shape has (a form itself reruns only when submitted).
        st.radio(
            "Limit", list(MODES), format_func=MODES.__getitem__, key="rf_mode", horizontal=True
        )
        limited = st.session_state["rf_mode"] == LIMIT
        two = _restore_shape_fields(limited)
        if limited:
            st.checkbox("A second limit (both must admit)", key="rf_two")
        _form_fields(data, d, target, limited=limited, two=two)


def _form_fields(
    data: AdminData, d: Draft, target: FormTarget, *, limited: bool, two: bool
) -> None:
    with st.form("rule_form", border=False):
        a, b = st.columns(2)
        a.text_input("Key", key="rf_key")
        b.text_input("Value", key="rf_value", help="empty: any value; * is a wildcard")
        if limited:
            _limit_fields("")
        if two:
            st.caption("Second limit")
            _limit_fields("2")
        a, b = st.columns(2)
        a.text_input("Name", key="rf_name", help="echoed to clients; what replaces can name")
        b.text_input(
            "Replaces", key="rf_replaces", help="names of limits this one replaces, comma-separated"
        )
        st.checkbox("Shadow mode (report OK even when over the limit)", key="rf_shadow")
        ok = st.form_submit_button("Apply to pending change", type="primary", key="rf_submit")
        cancel = st.form_submit_button("Cancel", key="rf_cancel")
    if cancel:
        del st.session_state[_FORM]
        st.rerun()
    if not ok:
        return
    form = _read_form(two=two)
    docs = pending.document_rules(d.policy)
    updated = pending.put_rule(docs, target.parent, target.old, form.document())
    if apply_edit(data, d, updated):
        del st.session_state[_FORM]
        st.session_state[_NOTICE] = (
            "Applied to the pending change; publish it on the Pending change tab."
        )
        st.rerun()


def _read_form(*, two: bool) -> RuleForm:
    s = st.session_state

    def limit(suffix: str) -> LimitFields:
        burst = s.get(f"rf_burst{suffix}")
        return LimitFields(
            int(s[f"rf_rpu{suffix}"]),
            s[f"rf_unit{suffix}"],
            s[f"rf_alg{suffix}"],
            int(burst) if burst is not None else None,
        )

    detailed, share = s.get("rf_flags", (False, False))
    return RuleForm(
        key=s["rf_key"],
        value=s["rf_value"],
        mode=s["rf_mode"],
        limits=[limit("")] + ([limit("2")] if two else []),
        name=s["rf_name"],
        replaces=[n.strip() for n in s["rf_replaces"].split(",") if n.strip()],
        shadow_mode=s["rf_shadow"],
        detailed_metric=detailed,
        share_threshold=share,
    )


def apply_edit(data: AdminData, d: Draft, docs: list[dict]) -> bool:
    """Validate ``docs`` as the domain's rules with the server's loader; keep them if valid."""
    try:
        policy = data.validate_descriptors(d.policy.domain, docs)
    except ConfigError as exc:
        show_problems(exc, pending.pending_text(d.policy.domain, docs))
        return False
    _set_draft(Draft(policy, d.base_version, d.loaded), d.policy.domain)
    return True


def show_problems(exc: ConfigError, text: str | None = None) -> None:
    st.error("The server's policy loader refused this change:")
    st.code("\n".join(exc.problems), language=None)
    if text is not None:
        with st.expander("The YAML it checked (line numbers as in the messages)"):
            st.code(text, language="yaml", line_numbers=True)


# -- YAML view ---------------------------------------------------------------------------------


def _yaml(data: AdminData, user: User, d: Draft) -> None:
    text = pending.pending_text(d.policy.domain, pending.document_rules(d.policy))
    st.code(text, language="yaml", line_numbers=True)
    if not user.can_edit:
        return
    with st.expander("Edit as YAML"):
        # Keyed by the text itself: a widget with a fixed key keeps what it first showed, so
        # after a form edit or a publish "Apply" would have put the old rules back.
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        edited = st.text_area(
            "YAML", value=text, height=300, key=f"rules_yaml:{d.policy.domain}:{digest}"
        )
        if st.button("Apply YAML to pending change", key="rules_yaml_apply"):
            try:
                policies = data.validate_document(edited, "yaml")
            except ConfigError as exc:
                show_problems(exc)
                return
            if [p.domain for p in policies] != [d.policy.domain]:
                st.error(
                    f"The YAML must define exactly the domain {session.escape(d.policy.domain)}."
                )
                return
            _set_draft(Draft(policies[0], d.base_version, d.loaded), d.policy.domain)
            st.session_state[_NOTICE] = "YAML applied to the pending change."
            st.rerun()


# -- diff and publish --------------------------------------------------------------------------


def _publish(data: AdminData, user: User, d: Draft) -> None:
    domain = d.policy.domain
    stale = st.session_state.get(_stale_key(domain))
    if stale is not None:
        st.error(session.escape(stale))
        if st.button("Reload the live version (discards the pending change)", key="rules_reload"):
            _set_draft(None, domain)
            st.rerun()
    diff = pending.diff(d.loaded, d.base_version, d.policy)
    if not diff:
        st.info("No pending changes: the rules shown are the live ones.")
        return
    st.code(diff, language="diff")
    comment = st.text_input("Comment", key="rules_comment", placeholder="why this change")
    left, right = st.columns(2)
    publish = left.button(
        "Publish",
        type="primary",
        key="rules_publish",
        disabled=not user.can_edit,
        help=None if user.can_edit else "Only editors may publish.",
    )
    if right.button("Discard pending change", key="rules_discard"):
        _set_draft(None, domain)
        st.rerun()
    if not publish:
        return
    try:
        with st.spinner("Publishing…"):
            version = data.publish(user, d.policy, base_version=d.base_version, comment=comment)
    except StaleVersionError as exc:
        # Kept in the session: the reload button must still be there on the next run.
        st.session_state[_stale_key(domain)] = str(exc)
        st.rerun()
    except (NotAllowedError, ConfigError) as exc:
        if isinstance(exc, ConfigError):
            show_problems(exc)
        else:
            st.error(str(exc))
        return
    _set_draft(None, domain)
    st.session_state[_NOTICE] = (
        f"Published version {version} of {session.escape(d.policy.domain)}."
        if version is not None
        else "Nothing to publish: the rules equal the live ones."
    )
    st.rerun()


if __name__ == "__main__":
    render()
