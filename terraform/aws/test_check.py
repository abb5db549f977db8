"""check.py passes on the module as it is, and fails, naming the problem, on a module or an
adapter changed to break it. Run: python3 -m unittest discover -s terraform/aws -p 'test_*.py'
"""

import shutil
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check  # noqa: E402

TERMINATE = '''  statement {
    sid       = "TerminateManagedInstances"
    effect    = "Allow"
    actions   = ["ec2:TerminateInstances"]
    resources = ["${local.ec2_arn}:${local.account}:instance/*"]
'''


class CheckTest(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="meridian-tf-check-"))
        self.addCleanup(shutil.rmtree, self.tmp)
        self.module = self.tmp / "module"
        self.module.mkdir()
        for tf in check.MODULE.glob("*.tf"):
            shutil.copy(tf, self.module)
        self.src = self.tmp / "src"
        shutil.copytree(check.ADAPTER_SRC, self.src)

    def edit(self, path: Path, old: str, new: str):
        text = path.read_text()
        self.assertIn(old, text, f"the test's text is no longer in {path.name}: update the test")
        path.write_text(text.replace(old, new))

    def problems(self):
        problems, _ = check.check(self.module, self.src, check.CLOUD_TAGS)
        return problems

    def assertFailsWith(self, *words):
        problems = self.problems()
        self.assertTrue(problems, "check.py passed a broken module")
        joined = "\n".join(problems)
        for w in words:
            self.assertIn(w, joined)

    def test_the_module_as_it_is_passes(self):
        self.assertEqual(self.problems(), [])

    def test_a_policy_without_terminate_instances_fails(self):
        self.edit(self.module / "main.tf", TERMINATE, TERMINATE.replace('["ec2:TerminateInstances"]', '["ec2:DescribeInstances"]'))
        self.assertFailsWith("ec2:TerminateInstances", "lib.rs:")

    def test_a_new_ec2_call_in_the_adapter_fails_until_allowed(self):
        self.edit(
            self.src / "lib.rs",
            "    async fn check(&self)",
            "    async fn stop(&self) { let client = self.client().await; let _ = client.stop_instances().send().await; }\n\n"
            "    async fn check(&self)",
        )
        self.assertFailsWith("ec2:StopInstances")

    def test_an_operation_called_on_another_name_is_reported(self):
        self.edit(
            self.src / "lib.rs",
            "    async fn check(&self)",
            "    async fn stop(&self) { let _ = self.client().await.stop_instances().send().await; }\n\n"
            "    async fn check(&self)",
        )
        self.assertFailsWith(".send() calls")

    def test_terminate_without_the_managed_tag_fails(self):
        self.edit(self.module / "main.tf", 'variable = "ec2:ResourceTag/${local.managed_tag}"', 'variable = "ec2:ResourceTag/owner"')
        self.assertFailsWith("TerminateManagedInstances", "ec2:ResourceTag/meridian-managed")

    def test_run_instances_without_the_request_tag_fails(self):
        self.edit(
            self.module / "main.tf",
            '''    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/${local.managed_tag}"
      values   = ["true"]
    }
  }

  # The other resources''',
            '''  }

  # The other resources''',
        )
        self.assertFailsWith("RunManagedInstances", "aws:RequestTag/meridian-managed")

    def test_a_tag_that_is_not_the_adapters_fails(self):
        self.edit(self.module / "main.tf", 'managed_tag = "meridian-managed"', 'managed_tag = "meridian-owned"')
        self.assertFailsWith("RunManagedInstances", "TerminateManagedInstances")

    def test_wildcard_actions_fail(self):
        self.edit(self.module / "main.tf", 'actions   = ["ec2:DescribeInstances", "ec2:DescribeInstanceTypes"]', 'actions   = ["ec2:*"]')
        self.assertFailsWith('wildcard action "ec2:*"')

    def test_tagging_outside_run_instances_fails(self):
        self.edit(self.module / "main.tf", 'values   = ["RunInstances"]', 'values   = ["CreateVolume"]')
        self.assertFailsWith("ec2:CreateTags", "ec2:CreateAction")

    def test_pass_role_beyond_the_job_role_fails(self):
        self.edit(self.module / "main.tf", "resources = [aws_iam_role.job.arn]", 'resources = ["*"]')
        self.assertFailsWith("iam:PassRole")

    def test_a_literal_bucket_in_the_job_policy_fails(self):
        self.edit(self.module / "main.tf", "resources = local.data_bucket_arns", 'resources = ["arn:aws:s3:::someone-elses-bucket"]')
        self.assertFailsWith("ListDataBuckets", "var.data_buckets")

    def test_more_rights_for_the_job_role_fail(self):
        self.edit(self.module / "main.tf", '"s3:PutObject",', '"s3:PutObject",\n      "s3:DeleteBucket",')
        self.assertFailsWith("s3:DeleteBucket")

    def test_another_policy_on_the_job_role_fails(self):
        (self.module / "extra.tf").write_text(
            'resource "aws_iam_role_policy_attachment" "admin" {\n'
            "  role       = aws_iam_role.job.name\n"
            '  policy_arn = "arn:aws:iam::aws:policy/AdministratorAccess"\n'
            "}\n"
        )
        self.assertFailsWith("aws_iam_role_policy_attachment.admin")

    def test_the_command_exits_non_zero_naming_the_problem(self):
        self.edit(self.module / "main.tf", TERMINATE, TERMINATE.replace('["ec2:TerminateInstances"]', '["ec2:DescribeInstances"]'))
        import contextlib
        import io

        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = check.main(["--module", str(self.module), "--adapter-src", str(self.src)])
        self.assertEqual(rc, 1)
        self.assertIn("ec2:TerminateInstances", err.getvalue())


if __name__ == "__main__":
    unittest.main()
