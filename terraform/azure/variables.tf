variable "subscription_id" {
  description = "The site's subscription: subscription: in its configuration."
  type        = string

  validation {
    condition     = can(regex("^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", var.subscription_id))
    error_message = "subscription_id: expected a subscription id (a GUID)."
  }
}

variable "resource_group_id" {
  description = "The resource group the site creates its VMs, NICs and disks in (resource_group: in its configuration), by resource id. Give Meridian a group of its own: the adapter may write and delete VMs, NICs and disks there."
  type        = string

  validation {
    condition     = can(regex("^/subscriptions/[^/]+/resourceGroups/[^/]+$", var.resource_group_id))
    error_message = "resource_group_id: expected /subscriptions/SUB/resourceGroups/NAME."
  }
}

variable "subnet_id" {
  description = "The subnet VMs get their NIC in (subnet: in the site's configuration), by resource id."
  type        = string

  validation {
    condition     = can(regex("^/subscriptions/.+/providers/Microsoft.Network/virtualNetworks/.+/subnets/[^/]+$", var.subnet_id))
    error_message = "subnet_id: expected a subnet's resource id."
  }
}

variable "image_scopes" {
  description = "Resource ids of the images or galleries the site's images: come from, when they are not marketplace images; the adapter may read these and no others."
  type        = list(string)
  default     = []
}

variable "principal_id" {
  description = "Object id of the identity Meridian's adapter runs as (the service principal of AZURE_CLIENT_ID, or a managed identity)."
  type        = string
}

variable "name_prefix" {
  description = "Prefix of the custom roles' names."
  type        = string
  default     = "meridian"
}
