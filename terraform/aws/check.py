#!/usr/bin/env python3
"""Checks terraform/aws against the AWS adapter's source (adapters/aws/src).

  - every EC2 operation the adapter calls (`client.<operation>()` in its source, in
    snake_case: run_instances is ec2:RunInstances) is allowed by a statement of the
    adapter's policy document (data "aws_iam_policy_document" "adapter");
  - launching with TagSpecifications is allowed ec2:CreateTags only with
    ec2:CreateAction = RunInstances; launching with an instance profile is allowed
    iam:PassRole, only to ec2.amazonaws.com;
  - every statement allowing ec2:RunInstances on instance or volume resources carries
    aws:RequestTag/meridian-managed = "true", and every statement allowing
    ec2:TerminateInstances carries ec2:ResourceTag/meridian-managed = "true" (the tag the
    adapter puts on what it launches, read from adapters/cloud);
  - no statement of any policy document grants "*" or "<service>:*" as an action, or uses
    NotAction or NotResource;
  - the job role's data policy (data "aws_iam_policy_document" "job_data") allows only
    S3's object read and write actions, on resources built from var.data_buckets only,
    and nothing else is attached to the job role.

Needs python-hcl2 (`pip install python-hcl2`). Exits 1 naming each problem, else prints a
one-line summary. `--module DIR` and `--adapter-src DIR` point it elsewhere (tests do).
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULE = Path(__file__).resolve().parent
ADAPTER_SRC = ROOT / "adapters" / "aws" / "src"
CLOUD_TAGS = ROOT / "adapters" / "cloud" / "src" / "lib.rs"

ADAPTER_DOC = "adapter"
JOB_DOC = "job_data"
JOB_ROLE = "job"
JOB_S3_ACTIONS = {
    "s3:GetObject",
    "s3:PutObject",
    "s3:ListBucket",
    "s3:AbortMultipartUpload",
    "s3:ListMultipartUploadParts",
}
# Methods of aws_sdk_ec2::Client that are not EC2 operations.
CLIENT_METHODS = {"config", "clone"}


# --- reading HCL ----------------------------------------------------------------------


def _clean(value):
    """python-hcl2's output, the same across its versions: no `__is_block__` or comment
    keys, and strings (and block labels) without the quotes that 6.x and later keep."""
    if isinstance(value, dict):
        return {
            _clean(k): _clean(v)
            for k, v in value.items()
            if not (isinstance(k, str) and k.startswith("__"))
        }
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, str) and len(value) >= 2 and value[0] == '"' and value[-1] == '"':
        return value[1:-1]
    return value


def _unwrap(value):
    """python-hcl2 before 4.x (and bc-python-hcl2, checkov's fork, which installs the same
    `hcl2` module) puts every attribute's value in a list of one: take it out."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if isinstance(v, list) and len(v) == 1 and not isinstance(v[0], dict):
                v = v[0]
            out[k] = _unwrap(v)
        return out
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    return value


def load_module(module: Path) -> dict[str, list]:
    """Every top-level block of every .tf file in `module`, by block type."""
    try:
        import hcl2
    except ImportError:
        sys.exit("check.py: python-hcl2 is missing: python3 -m pip install python-hcl2")
    wrapped = isinstance(hcl2.loads('a = "x"\n').get("a"), list)
    blocks: dict[str, list] = {}
    files = sorted(module.glob("*.tf"))
    if not files:
        sys.exit(f"check.py: no .tf files in {module}")
    for path in files:
        with path.open() as f:
            try:
                parsed = hcl2.load(f)
                parsed = _clean(_unwrap(parsed) if wrapped else parsed)
            except Exception as e:  # the parser's own exceptions differ by version
                sys.exit(f"check.py: {path}: not valid HCL: {e}")
        for kind, items in parsed.items():
            blocks.setdefault(kind, []).extend(items if isinstance(items, list) else [items])
    return blocks


def labelled(blocks: dict[str, list], kind: str, type_: str) -> dict[str, dict]:
    """`data "TYPE" "NAME"` / `resource "TYPE" "NAME"` blocks, by NAME."""
    out: dict[str, dict] = {}
    for item in blocks.get(kind, []):
        for t, named in item.items():
            if t == type_:
                out.update(named)
    return out


def as_list(value) -> list:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def statements(doc: dict) -> list[dict]:
    return as_list(doc.get("statement"))


def conditions(statement: dict) -> list[dict]:
    return as_list(statement.get("condition"))


def has_condition(statement: dict, variable: str, value: str, locals_: dict | None = None) -> bool:
    """Whether `statement` requires `variable` to equal `value` (the condition's
    variable read with the module's string locals, such as local.managed_tag, filled in)."""
    for c in conditions(statement):
        test = c.get("test", "")
        var = resolve(str(c.get("variable", "")), locals_ or {})
        values = [resolve(str(v), locals_ or {}) for v in as_list(c.get("values"))]
        if test in ("StringEquals", "StringEqualsIgnoreCase") and var.lower() == variable.lower() and values == [value]:
            return True
    return False


def resolve(text: str, locals_: dict) -> str:
    """`text` with each `${local.NAME}` whose local is a plain string replaced by it."""

    def value(m: re.Match) -> str:
        v = locals_.get(m.group(1))
        return v if isinstance(v, str) and "${" not in v else m.group(0)

    return re.sub(r"\$\{local\.(\w+)\}", value, text)


def allows(statement: dict, action: str) -> bool:
    if statement.get("effect", "Allow") != "Allow":
        return False
    return any(fnmatch.fnmatchcase(action.lower(), str(a).lower()) for a in as_list(statement.get("actions")))


# --- reading the adapter --------------------------------------------------------------


def strip_comments(rust: str) -> str:
    """`rust` without its line comments (a `//` after `:` is a URL's, and stays)."""
    return re.sub(r"(?<!:)//[^\n]*", "", rust)


def pascal(snake: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in snake.split("_"))


def adapter_calls(src: Path) -> tuple[dict[str, list[str]], list[str]]:
    """The EC2 operations called in `src`'s .rs files (ec2:Action → where), and the
    problems in finding them."""
    calls: dict[str, list[str]] = {}
    problems: list[str] = []
    files = sorted(src.glob("*.rs"))
    if not files:
        return calls, [f"no Rust sources in {src}"]
    for path in files:
        text = strip_comments(path.read_text())
        found = 0
        for m in re.finditer(r"\bclient\s*\.\s*([a-z][a-z0-9_]*)\s*\(\s*\)", text):
            name = m.group(1)
            if name in CLIENT_METHODS:
                continue
            found += 1
            line = text.count("\n", 0, m.start()) + 1
            calls.setdefault(f"ec2:{pascal(name)}", []).append(f"{path.name}:{line}")
        # Every operation's builder ends in .send(): one more .send() than operations
        # found means an operation called on something not named `client`.
        sends = len(re.findall(r"\.\s*send\s*\(\s*\)", text))
        if sends > found:
            problems.append(
                f"{path.name}: {sends} .send() calls but {found} `client.<operation>()` calls: "
                "call EC2 operations on a variable named `client` so that this check sees them"
            )
    if not calls:
        problems.append(f"found no `client.<operation>()` call in {src}: has the adapter changed shape?")
    return calls, problems


def managed_tag(cloud_tags: Path) -> str:
    m = re.search(r'pub const MANAGED: &str = "([^"]+)";', cloud_tags.read_text())
    if not m:
        sys.exit(f"check.py: no `pub const MANAGED` in {cloud_tags}")
    return m.group(1)


# --- the checks -----------------------------------------------------------------------


def check(module: Path = MODULE, src: Path = ADAPTER_SRC, cloud_tags: Path = CLOUD_TAGS) -> tuple[list[str], str]:
    """The problems found (empty: none), and a summary of what was checked."""
    blocks = load_module(module)
    tag = managed_tag(cloud_tags)
    problems: list[str] = []
    docs = labelled(blocks, "data", "aws_iam_policy_document")
    locals_ = module_locals(blocks)

    adapter = docs.get(ADAPTER_DOC)
    if adapter is None:
        return [f'no data "aws_iam_policy_document" "{ADAPTER_DOC}" in {module}'], ""
    adapter_statements = statements(adapter)

    # No wildcard actions, no NotAction/NotResource, a sid on each, anywhere.
    for name, doc in docs.items():
        for i, s in enumerate(statements(doc)):
            where = f'policy document "{name}", statement {s.get("sid") or i}'
            if not s.get("sid"):
                problems.append(f"{where}: has no sid")
            for a in as_list(s.get("actions")):
                service, _, action = str(a).partition(":")
                if a == "*" or action == "*" or service == "*":
                    problems.append(f'{where}: grants the wildcard action "{a}"')
            for key in ("not_actions", "not_resources", "not_principals"):
                if key in s:
                    problems.append(f"{where}: uses {key}; list what is allowed instead")

    # Every EC2 call the adapter makes is allowed.
    calls, found_problems = adapter_calls(src)
    problems += found_problems
    for action, where in sorted(calls.items()):
        if not any(allows(s, action) for s in adapter_statements):
            problems.append(
                f'the adapter calls {action} ({", ".join(where)}) but no statement of policy document "{ADAPTER_DOC}" allows it'
            )

    source = "".join(strip_comments(p.read_text()) for p in sorted(src.glob("*.rs")))

    # RunInstances creates instances and volumes only tagged meridian-managed=true.
    run = [s for s in adapter_statements if allows(s, "ec2:RunInstances")]
    for s in run:
        touches_created = any(
            r == "*" or r.endswith(":*") or ":instance/" in r or ":volume/" in r
            for r in map(str, as_list(s.get("resources")))
        )
        if touches_created and not has_condition(s, f"aws:RequestTag/{tag}", "true", locals_):
            problems.append(
                f'statement {s.get("sid")} allows ec2:RunInstances on instances or volumes without the condition aws:RequestTag/{tag} = "true"'
            )
    if "ec2:RunInstances" in calls and not any(
        ":instance/" in " ".join(map(str, as_list(s.get("resources")))) for s in run
    ):
        problems.append("no statement allows ec2:RunInstances on instance resources (instance/*)")

    # TerminateInstances only on what Meridian launched.
    for s in adapter_statements:
        if allows(s, "ec2:TerminateInstances") and not has_condition(s, f"ec2:ResourceTag/{tag}", "true", locals_):
            problems.append(
                f'statement {s.get("sid")} allows ec2:TerminateInstances without the condition ec2:ResourceTag/{tag} = "true"'
            )

    # Tags only as part of RunInstances.
    if re.search(r"\.\s*tag_specifications\s*\(", source):
        tagging = [s for s in adapter_statements if allows(s, "ec2:CreateTags")]
        if not tagging:
            problems.append("the adapter launches with TagSpecifications but no statement allows ec2:CreateTags")
    for s in adapter_statements:
        if allows(s, "ec2:CreateTags") and not has_condition(s, "ec2:CreateAction", "RunInstances", locals_):
            problems.append(
                f'statement {s.get("sid")} allows ec2:CreateTags without the condition ec2:CreateAction = "RunInstances"'
            )

    # PassRole of the job role, to EC2 only.
    if re.search(r"\.\s*iam_instance_profile\s*\(", source):
        if not any(allows(s, "iam:PassRole") for s in adapter_statements):
            problems.append("the adapter launches with an instance profile but no statement allows iam:PassRole")
    for s in adapter_statements:
        if allows(s, "iam:PassRole"):
            if not has_condition(s, "iam:PassedToService", "ec2.amazonaws.com", locals_):
                problems.append(
                    f'statement {s.get("sid")} allows iam:PassRole without the condition iam:PassedToService = "ec2.amazonaws.com"'
                )
            resources = [str(r) for r in as_list(s.get("resources"))]
            if resources != [f"${{aws_iam_role.{JOB_ROLE}.arn}}"]:
                problems.append(
                    f'statement {s.get("sid")} allows iam:PassRole on {resources}; expected only the job role (aws_iam_role.{JOB_ROLE}.arn)'
                )

    # The job role: the data buckets, nothing else.
    problems += check_job_role(blocks, docs, locals_)

    summary = (
        f"terraform/aws: ok: {len(calls)} EC2 operations the adapter calls "
        f"({', '.join(sorted(a.removeprefix('ec2:') for a in calls))}) are allowed, "
        f"launch and terminate require {tag}=true, no wildcard actions, "
        f"the job role reaches var.data_buckets only"
    )
    return problems, summary


def module_locals(blocks: dict[str, list]) -> dict[str, object]:
    out: dict[str, object] = {}
    for item in blocks.get("locals", []):
        out.update(item)
    return out


def check_job_role(blocks: dict[str, list], docs: dict[str, dict], locals_: dict[str, object]) -> list[str]:
    problems: list[str] = []
    job = docs.get(JOB_DOC)
    if job is None:
        return [f'no data "aws_iam_policy_document" "{JOB_DOC}" (the job role\'s data policy)']

    def from_buckets(expr) -> bool:
        """Whether `expr` (a resources value) is built from var.data_buckets alone: a
        for expression over it, or a local that is one; no literal bucket."""
        if isinstance(expr, list):
            return bool(expr) and all(from_buckets(e) for e in expr)
        text = str(expr)
        m = re.fullmatch(r"\$\{local\.(\w+)\}", text)
        if m:
            return m.group(1) in locals_ and from_buckets(locals_[m.group(1)])
        # [for b in var.data_buckets : "arn:PARTITION:s3:::${b}"], or ".../*" for objects
        return bool(
            re.fullmatch(r'\$\{\[for (\w+) in var\.data_buckets\s*:\s*"arn:[^"]*:s3:::\$\{\1\}(/\*)?"\s*\]\}', text)
        )

    for i, s in enumerate(statements(job)):
        where = f'policy document "{JOB_DOC}", statement {s.get("sid") or i}'
        if s.get("effect", "Allow") != "Allow":
            continue
        extra = sorted(set(map(str, as_list(s.get("actions")))) - JOB_S3_ACTIONS)
        if extra:
            problems.append(f"{where}: allows {', '.join(extra)}; the job role gets only {', '.join(sorted(JOB_S3_ACTIONS))}")
        if not from_buckets(s.get("resources")):
            problems.append(
                f"{where}: resources {s.get('resources')!r} are not built from var.data_buckets alone"
            )
    granted = {str(a) for s in statements(job) for a in as_list(s.get("actions"))}
    for a in sorted(JOB_S3_ACTIONS - granted):
        problems.append(f'policy document "{JOB_DOC}" does not allow {a}, which jobs need on their data buckets')

    # Nothing else reaches the job role.
    role_ref = f"${{aws_iam_role.{JOB_ROLE}.name}}"
    roles = labelled(blocks, "resource", "aws_iam_role")
    role = roles.get(JOB_ROLE)
    if role is None:
        problems.append(f'no resource "aws_iam_role" "{JOB_ROLE}"')
    else:
        for key in ("managed_policy_arns", "inline_policy"):
            if key in role:
                problems.append(f"aws_iam_role.{JOB_ROLE} has {key}: the job role gets its data policy only")
    for name, att in labelled(blocks, "resource", "aws_iam_role_policy_attachment").items():
        if att.get("role") == role_ref and att.get("policy_arn") != "${aws_iam_policy.job_data[0].arn}":
            problems.append(f"aws_iam_role_policy_attachment.{name} attaches {att.get('policy_arn')} to the job role")
    for name, pol in labelled(blocks, "resource", "aws_iam_role_policy").items():
        if pol.get("role") in (role_ref, f"${{aws_iam_role.{JOB_ROLE}.id}}"):
            problems.append(f"aws_iam_role_policy.{name} gives the job role an inline policy")

    variables = {k: v for item in blocks.get("variable", []) for k, v in item.items()}
    if variables.get("data_buckets", {}).get("type") != "${list(string)}":
        problems.append("variable data_buckets is missing or not list(string)")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", type=Path, default=MODULE)
    parser.add_argument("--adapter-src", type=Path, default=ADAPTER_SRC)
    parser.add_argument("--cloud-tags", type=Path, default=CLOUD_TAGS)
    args = parser.parse_args(argv)
    problems, summary = check(args.module, args.adapter_src, args.cloud_tags)
    if problems:
        print(f"terraform/aws: {len(problems)} problem(s):", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        return 1
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
