#!/usr/bin/env python3
"""Checks terraform/gcp, terraform/azure and terraform/oci against their adapters' source.

For each cloud, a table below says which rights each kind of call the adapter makes needs
(found in adapters/<cloud>/src by a pattern); the check fails when:
  - the adapter makes a call the table does not know (the table is out of date);
  - a right a call needs is not granted, or is granted where it should not be (GCP:
    making and ending instances outside the meridian-* name condition; Azure: writes
    outside the site's resource group; OCI: `manage` without a list of permissions);
  - a right is granted that no call needs, or a broad one is (GCP's owner, editor,
    compute.admin; Azure's `*`, not_actions; OCI's all-resources or instance-family);
  - the jobs' identity reaches more than var.data_buckets.

Needs python-hcl2 (`pip install python-hcl2`). Exits 1 naming each problem, else prints a
summary line per cloud. `--cloud` checks one; tests point it at copies with `check()`.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "aws"))
from check import as_list, labelled, load_module, strip_comments  # noqa: E402

TERRAFORM = Path(__file__).resolve().parent
ROOT = TERRAFORM.parent


def adapter_source(src: Path) -> str:
    """The adapter's Rust, without comments and without its unit tests."""
    out = []
    for p in sorted(src.glob("*.rs")):
        text = strip_comments(p.read_text())
        out.append(re.split(r"#\[cfg\(test\)\]\s*mod tests", text)[0])
    return "".join(out)

# --- Google Cloud ---------------------------------------------------------------------

# Every Compute Engine call of the adapter: a request builder, then `.set_project(`.
GCP_CALL = r"\.\s*([a-z_]+)\s*\(\s*\)\s*\.\s*set_project\s*\("
GCP_NEEDS = {
    "insert": [
        "compute.instances.create",
        "compute.instances.setMetadata",
        "compute.instances.setLabels",
        "compute.disks.create",
        "compute.images.useReadOnly",
        "compute.subnetworks.use",
    ],
    "delete": ["compute.instances.delete", "compute.disks.delete"],
    "get": ["compute.instances.get", "compute.machineTypes.get"],
    "list": ["compute.instances.list"],
    "aggregated_list": ["compute.instances.list"],
    "get_operation": ["compute.zoneOperations.get"],
}
# What the body of an insert may add.
GCP_OPTIONAL = {
    r"service_accounts\s*\.\s*push": ["compute.instances.setServiceAccount"],
    r"access_configs\s*\.\s*push": ["compute.subnetworks.useExternalIp"],
}
# Rights on instances and disks by name: only under the meridian-* condition.
GCP_BY_NAME = re.compile(r"^compute\.(instances|disks)\.(create|delete|set\w+)$")
GCP_BROAD = {
    "roles/owner",
    "roles/editor",
    "roles/compute.admin",
    "roles/compute.instanceAdmin",
    "roles/compute.instanceAdmin.v1",
    "roles/iam.serviceAccountUser",
    "roles/storage.admin",
}


def check_gcp(module: Path, src: Path) -> tuple[list[str], str]:
    blocks = load_module(module)
    source = adapter_source(src)
    problems: list[str] = []
    needed: set[str] = set()
    calls = sorted(set(re.findall(GCP_CALL, source)))
    if not calls:
        problems.append(f"found no Compute Engine call in {src}: has the adapter changed shape?")
    for call in calls:
        if call not in GCP_NEEDS:
            problems.append(f"the adapter calls {call}() but check_clouds.py does not know what it needs: add it to GCP_NEEDS")
        needed.update(GCP_NEEDS.get(call, []))
    optional: set[str] = set()
    for pattern, rights in GCP_OPTIONAL.items():
        if re.search(pattern, source):
            optional.update(rights)

    roles = labelled(blocks, "resource", "google_project_iam_custom_role")
    members = labelled(blocks, "resource", "google_project_iam_member")
    granted: dict[str, str] = {}  # permission → the role granting it
    for name, role in roles.items():
        perms = re.findall(r"compute\.[A-Za-z.]+", str(role.get("permissions")))
        for p in perms:
            granted[p] = name
    for p in sorted(needed - granted.keys()):
        problems.append(f"the adapter needs {p} but no custom role grants it")
    for p in sorted(granted.keys() - needed - optional):
        problems.append(f"custom role {granted[p]} grants {p}, which no call of the adapter needs")
    for p in sorted(optional - granted.keys()):
        problems.append(f"the adapter can need {p} (by its configuration) but no custom role grants it")

    bound: dict[str, dict] = {}
    for name, m in members.items():
        role = str(m.get("role", ""))
        if role in GCP_BROAD:
            problems.append(f"google_project_iam_member.{name} grants the broad role {role}")
        hit = re.fullmatch(r"\$\{google_project_iam_custom_role\.(\w+)\.name\}", role)
        if hit:
            bound[hit.group(1)] = m
    for name in roles:
        if name not in bound:
            problems.append(f"custom role {name} is bound to no one")
    for p, role in sorted(granted.items()):
        if GCP_BY_NAME.match(p):
            condition = as_list(bound.get(role, {}).get("condition"))
            expression = " ".join(str(c.get("expression", "")) for c in condition).replace("\\", "")
            # Each term: resource.name.extract("…/{name}").startsWith("${local.managed_prefix}"),
            # joined by || and nothing else.
            term = r'resource\.name\.extract\("/(?:instances|disks)/\{name\}"\)\.startsWith\("\$\{local\.managed_prefix\}"\)'
            if not re.fullmatch(rf"\s*{term}(\s*\|\|\s*{term})*\s*", expression):
                problems.append(f"custom role {role} grants {p} without the condition that the name starts with local.managed_prefix")
    prefix = dict((k, v) for item in blocks.get("locals", []) for k, v in item.items()).get("managed_prefix")
    if prefix != "meridian-" or 'format!("meridian-{}"' not in source:
        problems.append('local.managed_prefix is not "meridian-", the prefix of the names the adapter gives (instance_name)')

    # The jobs' service account: the data buckets only; the adapter may act as it only.
    for name, b in labelled(blocks, "resource", "google_storage_bucket_iam_member").items():
        if b.get("for_each") != "${toset(var.data_buckets)}" or b.get("bucket") != "${each.value}":
            problems.append(f"google_storage_bucket_iam_member.{name} is not one per var.data_buckets")
        if b.get("role") != "roles/storage.objectUser":
            problems.append(f"google_storage_bucket_iam_member.{name} grants {b.get('role')}; jobs get roles/storage.objectUser")
    for name, b in labelled(blocks, "resource", "google_service_account_iam_member").items():
        if b.get("service_account_id") != "${google_service_account.job.name}":
            problems.append(f"google_service_account_iam_member.{name} is on another service account than the jobs'")
    summary = f"terraform/gcp: ok: {len(calls)} kinds of Compute Engine call ({', '.join(calls)}) need {len(needed)} permissions, all granted and no others; instances and disks only as meridian-*"
    return problems, summary


# --- Azure ----------------------------------------------------------------------------

# (a pattern in the adapter's source, the operations it needs, where: the scope variable)
AZURE_NEEDS = [
    (r"virtualMachines", ["Microsoft.Compute/virtualMachines/write", "Microsoft.Compute/virtualMachines/read", "Microsoft.Compute/virtualMachines/delete"], "var.resource_group_id"),
    (r"/instanceView", ["Microsoft.Compute/virtualMachines/instanceView/read"], "var.resource_group_id"),
    (r"\"osDisk\"", ["Microsoft.Compute/disks/write", "Microsoft.Compute/disks/read"], "var.resource_group_id"),
    (r"\"deleteOption\": \"Delete\"", ["Microsoft.Compute/disks/delete", "Microsoft.Network/networkInterfaces/delete"], "var.resource_group_id"),
    (r"networkInterfaces", ["Microsoft.Network/networkInterfaces/write", "Microsoft.Network/networkInterfaces/read", "Microsoft.Network/networkInterfaces/delete", "Microsoft.Network/networkInterfaces/join/action"], "var.resource_group_id"),
    (r"Microsoft\.Compute/skus", ["Microsoft.Compute/skus/read"], "subscription"),
    (r"(?i)azure-asyncoperation", ["Microsoft.Compute/locations/operations/read"], "subscription"),
    (r"\"subnet\"", ["Microsoft.Network/virtualNetworks/subnets/join/action", "Microsoft.Network/virtualNetworks/subnets/read"], "var.subnet_id"),
    (r"imageReference", ["Microsoft.Compute/images/read", "Microsoft.Compute/galleries/read", "Microsoft.Compute/galleries/images/read", "Microsoft.Compute/galleries/images/versions/read"], "var.image_scopes"),
]
# Every ARM call of the adapter: `self.call(Method::…` or a create/delete helper.
AZURE_PATHS = r"/providers/(Microsoft\.\w+/\w+)"
AZURE_KNOWN_PATHS = {
    "Microsoft.Compute/virtualMachines",
    "Microsoft.Network/networkInterfaces",
    "Microsoft.Compute/skus",
    # The subnet a NIC joins (an id from the configuration, never called).
    "Microsoft.Network/virtualNetworks",
}


def check_azure(module: Path, src: Path) -> tuple[list[str], str]:
    blocks = load_module(module)
    source = adapter_source(src)
    problems: list[str] = []
    for path in sorted(set(re.findall(AZURE_PATHS, source)) - AZURE_KNOWN_PATHS):
        problems.append(f"the adapter calls {path} but check_clouds.py does not know what it needs: add it to AZURE_NEEDS")
    roles = labelled(blocks, "resource", "azurerm_role_definition")
    granted: dict[str, tuple[str, str]] = {}  # action → (role, scope)
    for name, role in roles.items():
        for perms in as_list(role.get("permissions")):
            for a in as_list(perms.get("actions")):
                scope = str(role.get("assignable_scopes"))
                granted[str(a)] = (name, scope)
                if "*" in str(a):
                    problems.append(f"azurerm_role_definition.{name} grants the wildcard action {a}")
            if as_list(perms.get("not_actions")) or perms.get("data_actions"):
                problems.append(f"azurerm_role_definition.{name} uses not_actions or data_actions; list what is allowed")
    needed: set[str] = set()
    for pattern, actions, where in AZURE_NEEDS:
        if not re.search(pattern, source):
            continue
        for a in actions:
            needed.add(a)
            if a not in granted:
                problems.append(f"the adapter needs {a} (it uses {pattern!r}) but no role grants it")
                continue
            role, scope = granted[a]
            expected = "${var.subscription_id}" if where == "subscription" else where
            if expected not in scope:
                problems.append(f"azurerm_role_definition.{role} grants {a} at {scope}; expected only at {where}")
    for a in sorted(granted.keys() - needed):
        problems.append(f"azurerm_role_definition.{granted[a][0]} grants {a}, which no call of the adapter needs")
    for name, a in labelled(blocks, "resource", "azurerm_role_assignment").items():
        if "role_definition_name" in a:
            problems.append(f"azurerm_role_assignment.{name} assigns the built-in role {a['role_definition_name']}")
    summary = f"terraform/azure: ok: {len(needed)} operations the adapter's calls need, each granted at its narrowest scope, and no others"
    return problems, summary


# --- OCI ------------------------------------------------------------------------------

# (a pattern in the adapter's source, (verb, resource type, permission or None) it needs)
OCI_NEEDS = [
    (r"Method::POST,\s*\"/instances\"", [("manage", "instances", "INSTANCE_CREATE"), ("manage", "boot-volumes", "BOOT_VOLUME_CREATE"), ("use", "vnics", None), ("use", "subnets", None), ("read", "instance-images", None)]),
    (r"Method::DELETE", [("manage", "instances", "INSTANCE_DELETE"), ("use", "vnics", None), ("use", "subnets", None)]),
    (r"\"preserveBootVolume\",\s*\"false\"", [("manage", "boot-volumes", "BOOT_VOLUME_DELETE")]),
    (r"\"/instances\"", [("manage", "instances", "INSTANCE_INSPECT"), ("manage", "instances", "INSTANCE_READ")]),
    (r"\"/shapes\"", [("manage", "instances", "INSTANCE_INSPECT")]),
]
OCI_PATHS = r"\"(/[a-z]+)[\"/]"
OCI_KNOWN_PATHS = {"/instances", "/shapes"}
OCI_STATEMENT = re.compile(
    r"^Allow (group|dynamic-group) (\S+) to (inspect|read|use|manage) ([\w-]+) in (compartment id \S+|tenancy)(?: where (.*))?$"
)
VERBS = ["inspect", "read", "use", "manage"]


def check_oci(module: Path, src: Path) -> tuple[list[str], str]:
    blocks = load_module(module)
    source = adapter_source(src)
    problems: list[str] = []
    for path in sorted(set(re.findall(OCI_PATHS, source)) - OCI_KNOWN_PATHS):
        problems.append(f"the adapter calls {path} but check_clouds.py does not know what it needs: add it to OCI_NEEDS")
    policies = labelled(blocks, "resource", "oci_identity_policy")
    adapter = policies.get("adapter")
    if adapter is None:
        return [f'no resource "oci_identity_policy" "adapter" in {module}'], ""
    grants: list[tuple[str, str, set[str] | None]] = []
    for text in as_list(adapter.get("statements")):
        m = OCI_STATEMENT.match(str(text))
        if not m:
            problems.append(f"cannot read the statement {text!r}")
            continue
        _, _, verb, resource, where, condition = m.groups()
        if where == "tenancy":
            problems.append(f"{text!r}: the whole tenancy; name the site's compartment")
        if resource in ("all-resources", "instance-family", "virtual-network-family", "volume-family"):
            problems.append(f"{text!r}: grants a whole family ({resource}); name the resource types")
        perms = set(re.findall(r"request\.permission\s*=\s*'(\w+)'", condition or "")) or None
        if verb == "manage" and perms is None:
            problems.append(f"{text!r}: manage without a list of request.permission")
        grants.append((verb, resource, perms))
    needed = 0
    for pattern, rights in OCI_NEEDS:
        if not re.search(pattern, source):
            continue
        for verb, resource, perm in rights:
            needed += 1
            ok = any(
                r == resource and VERBS.index(v) >= VERBS.index(verb) and (perm is None or (ps is not None and perm in ps))
                for v, r, ps in grants
            )
            if not ok:
                problems.append(f"the adapter needs {verb} {resource}{' ' + perm if perm else ''} (it uses {pattern!r}) but no statement grants it")
    for name, p in policies.items():
        if name == "adapter":
            continue
        for text in as_list(p.get("statements")) if isinstance(p.get("statements"), list) else [p.get("statements")]:
            text = str(text)
            if "manage objects" not in text or "target.bucket.name" not in text or "var.data_buckets" not in text and "${b}" not in text:
                problems.append(f"oci_identity_policy.{name}: {text!r} is not objects of var.data_buckets only")
    for name, g in labelled(blocks, "resource", "oci_identity_dynamic_group").items():
        if "local.managed_tag" not in str(g.get("matching_rule")):
            problems.append(f"oci_identity_dynamic_group.{name} does not match on the meridian-managed tag")
    summary = f"terraform/oci: ok: {needed} rights the adapter's calls need are granted, manage only with listed permissions, no families, no tenancy-wide grants"
    return problems, summary


CLOUDS = {
    "gcp": (check_gcp, TERRAFORM / "gcp", ROOT / "adapters" / "gcp" / "src"),
    "azure": (check_azure, TERRAFORM / "azure", ROOT / "adapters" / "azure" / "src"),
    "oci": (check_oci, TERRAFORM / "oci", ROOT / "adapters" / "oci" / "src"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cloud", choices=sorted(CLOUDS), action="append")
    args = parser.parse_args(argv)
    failed = False
    for cloud in args.cloud or sorted(CLOUDS):
        check, module, src = CLOUDS[cloud]
        problems, summary = check(module, src)
        if problems:
            failed = True
            print(f"terraform/{cloud}: {len(problems)} problem(s):", file=sys.stderr)
            for p in problems:
                print(f"  - {p}", file=sys.stderr)
        else:
            print(summary)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
