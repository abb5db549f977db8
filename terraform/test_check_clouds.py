"""check_clouds.py passes on the modules as they are, and fails, naming the problem, on a
module or an adapter changed to break it.
Run: python3 -m unittest discover -s terraform -p 'test_check_clouds.py'
"""

import shutil
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_clouds  # noqa: E402


class CheckCloudsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="meridian-tf-clouds-"))
        self.addCleanup(shutil.rmtree, self.tmp)

    def copy(self, cloud: str):
        check, module, src = check_clouds.CLOUDS[cloud]
        base = Path(tempfile.mkdtemp(prefix=f"{cloud}-", dir=self.tmp))
        m, s = base / "module", base / "src"
        shutil.copytree(module, m)
        shutil.copytree(src, s)
        return check, m, s

    def edit(self, path: Path, old: str, new: str):
        text = path.read_text()
        self.assertIn(old, text, f"the test's text is no longer in {path.name}: update the test")
        path.write_text(text.replace(old, new, 1))

    def assertProblem(self, check, module, src, words):
        problems, _ = check(module, src)
        self.assertTrue(
            any(all(w in p for w in words) for p in problems),
            f"expected a problem with {words}; got {problems}",
        )

    def test_the_modules_as_they_are_pass(self):
        for cloud, (check, module, src) in check_clouds.CLOUDS.items():
            problems, summary = check(module, src)
            self.assertEqual(problems, [], cloud)
            self.assertIn("ok", summary)

    def test_gcp_a_missing_permission_an_extra_one_and_a_lost_condition_are_named(self):
        check, m, s = self.copy("gcp")
        self.edit(m / "main.tf", '"compute.zoneOperations.get",\n', "")
        self.assertProblem(check, m, s, ["compute.zoneOperations.get", "no custom role"])
        self.edit(m / "main.tf", '"compute.machineTypes.get",', '"compute.machineTypes.get",\n    "compute.instances.start",')
        self.assertProblem(check, m, s, ["compute.instances.start", "no call"])
        self.edit(m / "main.tf", ".startsWith(", ".endsWith(")
        self.assertProblem(check, m, s, ["compute.instances.create", "condition"])
        self.edit(m / "main.tf", 'role               = "roles/iam.serviceAccountUser"', 'role               = "roles/iam.serviceAccountUser"\n}\n\nresource "google_project_iam_member" "wide" {\n  project = var.project\n  role    = "roles/editor"\n  member  = "user:x@example.com"')
        self.assertProblem(check, m, s, ["broad role roles/editor"])

    def test_gcp_a_new_call_of_the_adapter_must_be_known(self):
        check, m, s = self.copy("gcp")
        self.edit(s / "lib.rs", "            .delete()\n", "            .stop()\n")
        self.assertProblem(check, m, s, ["stop()", "GCP_NEEDS"])

    def test_azure_wildcards_and_writes_outside_the_resource_group_are_named(self):
        check, m, s = self.copy("azure")
        self.edit(m / "main.tf", '"Microsoft.Compute/skus/read",', '"Microsoft.Compute/skus/read",\n      "Microsoft.Compute/*",')
        self.assertProblem(check, m, s, ["wildcard", "Microsoft.Compute/*"])
        check, m, s = self.copy("azure")
        self.edit(m / "main.tf", '      "Microsoft.Compute/virtualMachines/write",\n', "")
        self.edit(m / "main.tf", '"Microsoft.Compute/skus/read",', '"Microsoft.Compute/skus/read",\n      "Microsoft.Compute/virtualMachines/write",')
        self.assertProblem(check, m, s, ["virtualMachines/write", "expected only at var.resource_group_id"])

    def test_oci_bare_manage_tenancy_wide_grants_and_missing_rights_are_named(self):
        check, m, s = self.copy("oci")
        self.edit(m / "main.tf", "to manage instances in compartment id ${var.compartment_ocid} where any {request.permission = 'INSTANCE_CREATE', request.permission = 'INSTANCE_DELETE', request.permission = 'INSTANCE_READ', request.permission = 'INSTANCE_INSPECT'}", "to manage instances in tenancy")
        self.assertProblem(check, m, s, ["whole tenancy"])
        self.assertProblem(check, m, s, ["manage without a list"])
        check, m, s = self.copy("oci")
        self.edit(m / "main.tf", '    "Allow group ${local.group} to use subnets in compartment id ${local.network_compartment}",\n', "")
        self.assertProblem(check, m, s, ["use subnets", "no statement"])


if __name__ == "__main__":
    unittest.main()
