# IAM policies for Meridian's OCI site adapter (adapters/oci):
#   - the adapter's group: launch, list and terminate instances (with their primary VNIC
#     and boot volume) in the site's compartment, each verb narrowed to the permissions
#     the calls need; use the site's subnets; read its custom images;
#   - the jobs: instances Meridian launched (freeform tag meridian-managed=true) form a
#     dynamic group that may use the data buckets' objects, and nothing else.
# check_clouds.py (terraform/) checks the statements against the calls the adapter makes.

locals {
  network_compartment = coalesce(var.network_compartment_ocid, var.compartment_ocid)
  image_compartment   = coalesce(var.image_compartment_ocid, var.compartment_ocid)
  group               = var.adapter_group_name
  # The tag on everything the adapter launches (meridian_adapter_cloud::tags::MANAGED).
  managed_tag = "meridian-managed"
}

resource "oci_identity_policy" "adapter" {
  compartment_id = var.tenancy_ocid
  name           = "${var.name_prefix}-oci-adapter"
  description    = "Meridian's OCI site adapter: its instances, their VNICs and boot volumes, the site's subnets and images."
  statements = [
    "Allow group ${local.group} to manage instances in compartment id ${var.compartment_ocid} where any {request.permission = 'INSTANCE_CREATE', request.permission = 'INSTANCE_DELETE', request.permission = 'INSTANCE_READ', request.permission = 'INSTANCE_INSPECT'}",
    "Allow group ${local.group} to manage boot-volumes in compartment id ${var.compartment_ocid} where any {request.permission = 'BOOT_VOLUME_CREATE', request.permission = 'BOOT_VOLUME_DELETE', request.permission = 'BOOT_VOLUME_READ', request.permission = 'BOOT_VOLUME_INSPECT'}",
    "Allow group ${local.group} to use vnics in compartment id ${var.compartment_ocid}",
    "Allow group ${local.group} to use subnets in compartment id ${local.network_compartment}",
    "Allow group ${local.group} to read instance-images in compartment id ${local.image_compartment}",
  ]
}

resource "oci_identity_dynamic_group" "jobs" {
  count          = length(var.data_buckets) > 0 ? 1 : 0
  compartment_id = var.tenancy_ocid
  name           = "${var.name_prefix}-oci-jobs"
  description    = "Instances Meridian launched in the site's compartment."
  matching_rule  = "All {instance.compartment.id = '${var.compartment_ocid}', tag.${local.managed_tag}.value = 'true'}"
}

resource "oci_identity_policy" "jobs" {
  count          = length(var.data_buckets) > 0 ? 1 : 0
  compartment_id = var.compartment_ocid
  name           = "${var.name_prefix}-oci-jobs-data"
  description    = "Meridian's jobs: the data buckets' objects, nothing else."
  statements = [
    for b in var.data_buckets :
    "Allow dynamic-group ${oci_identity_dynamic_group.jobs[0].name} to manage objects in compartment id ${var.compartment_ocid} where target.bucket.name = '${b}'"
  ]
}
