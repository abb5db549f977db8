output "adapter_service_account" {
  description = "The service account Meridian's adapter runs as: give Meridian its credentials (a key file as credentials: {file: …}, or workload identity)."
  value       = google_service_account.adapter.email
}

output "job_service_account" {
  description = "The service account instances run as: put it in the site configuration as service_account."
  value       = google_service_account.job.email
}
