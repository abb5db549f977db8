variable "region" {
  description = "The site's region: region: in its configuration."
  type        = string
}

variable "tenancy_ocid" {
  description = "The tenancy: dynamic groups live at its root."
  type        = string

  validation {
    condition     = can(regex("^ocid1\\.tenancy\\.", var.tenancy_ocid))
    error_message = "tenancy_ocid: expected ocid1.tenancy.oc1..…"
  }
}

variable "compartment_ocid" {
  description = "The compartment the site launches instances in (compartment: in its configuration)."
  type        = string

  validation {
    condition     = can(regex("^ocid1\\.(compartment|tenancy)\\.", var.compartment_ocid))
    error_message = "compartment_ocid: expected ocid1.compartment.oc1..…"
  }
}

variable "network_compartment_ocid" {
  description = "The compartment of the site's subnets; null: the site's compartment."
  type        = string
  default     = null
  nullable    = true
}

variable "image_compartment_ocid" {
  description = "The compartment of the site's custom images; null: the site's compartment. Platform images need no policy."
  type        = string
  default     = null
  nullable    = true
}

variable "adapter_group_name" {
  description = "The IAM group of the user whose API key Meridian's adapter signs with."
  type        = string
}

variable "data_buckets" {
  description = "Object Storage buckets (in the site's compartment) jobs read inputs from and write outputs to, with their instance principal; empty gives jobs no rights."
  type        = list(string)
  default     = []
}

variable "name_prefix" {
  description = "Prefix of the policies' and the dynamic group's names."
  type        = string
  default     = "meridian"
}
