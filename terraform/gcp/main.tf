# IAM for Meridian's Google Cloud site adapter (adapters/gcp):
#   - the adapter's service account, with two custom roles: what it reads and uses (lists,
#     operations, machine types, images, subnetworks), and what it makes and ends
#     (instances and their boot disks) only under the names it gives: meridian-…;
#   - the jobs' service account: the data buckets, nothing else.
# check_clouds.py (terraform/) checks these roles against the calls the adapter's source
# makes.

locals {
  # The name of every instance (and so of its boot disk) the adapter makes
  # (meridian_adapter_gcp::instance_name).
  managed_prefix = "meridian-"
}

# --- The adapter ---------------------------------------------------------------------

resource "google_service_account" "adapter" {
  account_id   = "${var.name_prefix}-adapter"
  display_name = "Meridian's Google Cloud site adapter"
}

# Reads, and the shared things an insert uses, whatever they are named.
resource "google_project_iam_custom_role" "adapter_read" {
  role_id     = "${replace(var.name_prefix, "-", "_")}_adapter_read"
  title       = "Meridian adapter: read and use"
  description = "Lists and reads instances, zone operations and machine types; uses images and subnetworks in inserts."
  permissions = concat([
    "compute.instances.list",
    "compute.instances.get",
    "compute.zoneOperations.get",
    "compute.machineTypes.get",
    "compute.images.useReadOnly",
    "compute.subnetworks.use",
  ], var.external_ip ? ["compute.subnetworks.useExternalIp"] : [])
}

# Making and ending instances and their boot disks: bound below only to names that start
# with meridian-.
resource "google_project_iam_custom_role" "adapter_manage" {
  role_id     = "${replace(var.name_prefix, "-", "_")}_adapter_manage"
  title       = "Meridian adapter: make and end its instances"
  description = "Inserts and deletes instances named meridian-*, with their boot disks, labels, startup script and service account."
  permissions = [
    "compute.instances.create",
    "compute.instances.setMetadata",
    "compute.instances.setLabels",
    "compute.instances.setServiceAccount",
    "compute.instances.delete",
    "compute.disks.create",
    "compute.disks.delete",
  ]
}

resource "google_project_iam_member" "adapter_read" {
  project = var.project
  role    = google_project_iam_custom_role.adapter_read.name
  member  = "serviceAccount:${google_service_account.adapter.email}"
}

resource "google_project_iam_member" "adapter_manage" {
  project = var.project
  role    = google_project_iam_custom_role.adapter_manage.name
  member  = "serviceAccount:${google_service_account.adapter.email}"

  condition {
    title       = "meridian-instances-only"
    description = "Only instances and disks named meridian-*, the names the adapter gives."
    expression  = "resource.name.extract(\"/instances/{name}\").startsWith(\"${local.managed_prefix}\") || resource.name.extract(\"/disks/{name}\").startsWith(\"${local.managed_prefix}\")"
  }
}

# The adapter may make instances run as the jobs' service account, and as no other.
resource "google_service_account_iam_member" "adapter_acts_as_job" {
  service_account_id = google_service_account.job.name
  role               = "roles/iam.serviceAccountUser"
  member             = "serviceAccount:${google_service_account.adapter.email}"
}

# --- The jobs ------------------------------------------------------------------------

resource "google_service_account" "job" {
  account_id   = "${var.name_prefix}-job"
  display_name = "Meridian jobs on Google Cloud"
}

resource "google_storage_bucket_iam_member" "job_data" {
  for_each = toset(var.data_buckets)
  bucket   = each.value
  role     = "roles/storage.objectUser"
  member   = "serviceAccount:${google_service_account.job.email}"
}
