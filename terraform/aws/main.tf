# IAM for Meridian's AWS EC2 site adapter (adapters/aws):
#   - the adapter's policy: launch, list and end the instances Meridian tags
#     meridian-managed=true, and nothing else;
#   - the jobs' role and instance profile: read and write the data buckets, nothing else.
# check.py beside this file checks the adapter policy against the EC2 calls the adapter's
# source makes.

data "aws_partition" "current" {}

data "aws_caller_identity" "current" {}

locals {
  partition = data.aws_partition.current.partition
  account   = data.aws_caller_identity.current.account_id
  ec2_arn   = "arn:${local.partition}:ec2:${var.region}"

  # The tag every instance (and its volumes) the adapter launches carries
  # (meridian_adapter_cloud::tags::MANAGED).
  managed_tag = "meridian-managed"

  data_bucket_arns = [for b in var.data_buckets : "arn:${local.partition}:s3:::${b}"]
  data_object_arns = [for b in var.data_buckets : "arn:${local.partition}:s3:::${b}/*"]
  has_data_buckets = length(var.data_buckets) > 0
}

# --- The adapter ---------------------------------------------------------------------

data "aws_iam_policy_document" "adapter" {
  # RunInstances creates the instance and its volumes: only with meridian-managed=true
  # among the request's tags (the adapter tags both through TagSpecifications).
  statement {
    sid     = "RunManagedInstances"
    effect  = "Allow"
    actions = ["ec2:RunInstances"]
    resources = [
      "${local.ec2_arn}:${local.account}:instance/*",
      "${local.ec2_arn}:${local.account}:volume/*",
    ]

    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/${local.managed_tag}"
      values   = ["true"]
    }
  }

  # The other resources a RunInstances request names or creates: the image, the subnet
  # (or the default VPC's), security groups, the primary network interface, the optional
  # key pair, and the spot request of a spot launch. None of them is tagged. (The adapter
  # places by availability zone only, never in a placement group.)
  statement {
    sid     = "RunInstancesWithItsResources"
    effect  = "Allow"
    actions = ["ec2:RunInstances"]
    resources = [
      "${local.ec2_arn}::image/*",
      "${local.ec2_arn}:${local.account}:subnet/*",
      "${local.ec2_arn}:${local.account}:security-group/*",
      "${local.ec2_arn}:${local.account}:network-interface/*",
      "${local.ec2_arn}:${local.account}:key-pair/*",
      "${local.ec2_arn}:${local.account}:spot-instances-request/*",
    ]
  }

  # Tags only as part of RunInstances (its TagSpecifications), never on their own.
  statement {
    sid     = "TagOnLaunch"
    effect  = "Allow"
    actions = ["ec2:CreateTags"]
    resources = [
      "${local.ec2_arn}:${local.account}:instance/*",
      "${local.ec2_arn}:${local.account}:volume/*",
    ]

    condition {
      test     = "StringEquals"
      variable = "ec2:CreateAction"
      values   = ["RunInstances"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/${local.managed_tag}"
      values   = ["true"]
    }
  }

  # Only instances Meridian launched.
  statement {
    sid       = "TerminateManagedInstances"
    effect    = "Allow"
    actions   = ["ec2:TerminateInstances"]
    resources = ["${local.ec2_arn}:${local.account}:instance/*"]

    condition {
      test     = "StringEquals"
      variable = "ec2:ResourceTag/${local.managed_tag}"
      values   = ["true"]
    }
  }

  # EC2's Describe calls support no resource-level permissions: "*" is the only resource
  # they take. The adapter filters DescribeInstances by meridian-managed=true itself.
  statement {
    sid       = "DescribeInstancesAndTypes"
    effect    = "Allow"
    actions   = ["ec2:DescribeInstances", "ec2:DescribeInstanceTypes"]
    resources = ["*"]

    condition {
      test     = "StringEquals"
      variable = "aws:RequestedRegion"
      values   = [var.region]
    }
  }

  # Launching with the jobs' instance profile passes its role to EC2: that role only.
  statement {
    sid       = "PassJobRoleToEc2"
    effect    = "Allow"
    actions   = ["iam:PassRole"]
    resources = [aws_iam_role.job.arn]

    condition {
      test     = "StringEquals"
      variable = "iam:PassedToService"
      values   = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_policy" "adapter" {
  name        = "${var.name_prefix}-aws-adapter"
  description = "Meridian's AWS EC2 site adapter: launch, describe and terminate meridian-managed instances."
  policy      = data.aws_iam_policy_document.adapter.json
}

resource "aws_iam_role_policy_attachment" "adapter" {
  count      = var.adapter_role_name == null ? 0 : 1
  role       = var.adapter_role_name
  policy_arn = aws_iam_policy.adapter.arn
}

# --- The jobs -------------------------------------------------------------------------

data "aws_iam_policy_document" "job_trust" {
  statement {
    sid     = "Ec2AssumesJobRole"
    effect  = "Allow"
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "job" {
  name               = "${var.name_prefix}-job"
  description        = "The role Meridian's jobs on EC2 run with: the data buckets, nothing else."
  assume_role_policy = data.aws_iam_policy_document.job_trust.json
}

resource "aws_iam_instance_profile" "job" {
  name = "${var.name_prefix}-job"
  role = aws_iam_role.job.name
}

data "aws_iam_policy_document" "job_data" {
  count = local.has_data_buckets ? 1 : 0

  statement {
    sid       = "ListDataBuckets"
    effect    = "Allow"
    actions   = ["s3:ListBucket"]
    resources = local.data_bucket_arns
  }

  statement {
    sid    = "ReadWriteDataObjects"
    effect = "Allow"
    actions = [
      "s3:GetObject",
      "s3:PutObject",
      "s3:AbortMultipartUpload",
      "s3:ListMultipartUploadParts",
    ]
    resources = local.data_object_arns
  }
}

resource "aws_iam_policy" "job_data" {
  count       = local.has_data_buckets ? 1 : 0
  name        = "${var.name_prefix}-job-data"
  description = "Meridian's jobs: read and write the data buckets."
  policy      = data.aws_iam_policy_document.job_data[0].json
}

resource "aws_iam_role_policy_attachment" "job_data" {
  count      = local.has_data_buckets ? 1 : 0
  role       = aws_iam_role.job.name
  policy_arn = aws_iam_policy.job_data[0].arn
}
