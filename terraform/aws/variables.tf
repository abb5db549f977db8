variable "region" {
  description = "The AWS region of the site: the region in the adapter's site configuration (region:)."
  type        = string

  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]+$", var.region))
    error_message = "region: expected an AWS region such as us-east-1."
  }
}

variable "name_prefix" {
  description = "Prefix of every name this module gives (IAM policies, role, instance profile)."
  type        = string
  default     = "meridian"

  validation {
    condition     = can(regex("^[A-Za-z0-9+=,.@_-]{1,32}$", var.name_prefix))
    error_message = "name_prefix: 1 to 32 of letters, digits and +=,.@_-."
  }
}

variable "data_buckets" {
  description = "Names (not ARNs) of the S3 buckets that jobs read inputs from and write outputs to. The job role may use these buckets and no others; empty gives the job role no rights at all."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for b in var.data_buckets : can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", b))])
    error_message = "data_buckets: expected bucket names such as my-meridian-data (no ARNs, no wildcards)."
  }
}

variable "adapter_role_name" {
  description = "Name of an existing IAM role the Meridian adapter runs as (for example its EC2 instance role, or an IRSA role); the adapter policy is attached to it. Null: attach the policy (output adapter_policy_arn) yourself."
  type        = string
  default     = null
  nullable    = true
}
