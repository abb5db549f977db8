output "adapter_policy_arn" {
  description = "ARN of the adapter's IAM policy (RunInstances, DescribeInstances, TerminateInstances, DescribeInstanceTypes, PassRole of the job role)."
  value       = aws_iam_policy.adapter.arn
}

output "job_instance_profile_name" {
  description = "Name of the jobs' instance profile: put it in the site configuration as instance_profile."
  value       = aws_iam_instance_profile.job.name
}

output "job_role_arn" {
  description = "ARN of the role jobs run with (S3 access to data_buckets only)."
  value       = aws_iam_role.job.arn
}
