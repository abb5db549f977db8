variable "project" {
  description = "The project of the site: project: in the adapter's site configuration."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project))
    error_message = "project: expected a project id such as my-research-project."
  }
}

variable "region" {
  description = "The site's region: region: in its configuration."
  type        = string

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]+$", var.region))
    error_message = "region: expected a Compute Engine region such as us-central1."
  }
}

variable "name_prefix" {
  description = "Prefix of every name this module gives (custom roles, service accounts)."
  type        = string
  default     = "meridian"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,15}$", var.name_prefix))
    error_message = "name_prefix: 1 to 16 lower-case letters, digits and -, starting with a letter."
  }
}

variable "data_buckets" {
  description = "Names of the Cloud Storage buckets jobs read inputs from and write outputs to. The jobs' service account may use these buckets and no others; empty gives it no rights at all."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for b in var.data_buckets : can(regex("^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$", b))])
    error_message = "data_buckets: expected bucket names such as my-meridian-data (no gs:// and no wildcards)."
  }
}

variable "external_ip" {
  description = "Whether the site gives instances a public address (external_ip: true in its configuration): the adapter then needs compute.subnetworks.useExternalIp."
  type        = bool
  default     = false
}
