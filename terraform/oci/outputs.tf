output "adapter_policy_id" {
  description = "The adapter's policy."
  value       = oci_identity_policy.adapter.id
}
