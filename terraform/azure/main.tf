# Azure RBAC for Meridian's Azure site adapter (adapters/azure): custom roles with exactly
# the Resource Manager operations the adapter calls, each assigned at the narrowest scope
# it needs:
#   - in the site's resource group: VMs, their NICs and OS disks (create, read, delete);
#   - in the subscription: the compute resource SKUs (the sizes it refreshes shapes from)
#     and the compute operations it follows (Azure-AsyncOperation);
#   - on the site's subnet: joining a NIC to it;
#   - on image_scopes: reading the custom images it creates VMs from.
# check_clouds.py (terraform/) checks the roles against the calls the adapter makes.

# --- In the resource group -----------------------------------------------------------

resource "azurerm_role_definition" "adapter" {
  name        = "${var.name_prefix}-azure-adapter"
  scope       = var.resource_group_id
  description = "Meridian's Azure site adapter: creates, reads and deletes VMs with their NICs and OS disks in one resource group."

  permissions {
    actions = [
      "Microsoft.Compute/virtualMachines/write",
      "Microsoft.Compute/virtualMachines/read",
      "Microsoft.Compute/virtualMachines/delete",
      "Microsoft.Compute/virtualMachines/instanceView/read",
      "Microsoft.Compute/disks/write",
      "Microsoft.Compute/disks/read",
      "Microsoft.Compute/disks/delete",
      "Microsoft.Network/networkInterfaces/write",
      "Microsoft.Network/networkInterfaces/read",
      "Microsoft.Network/networkInterfaces/delete",
      "Microsoft.Network/networkInterfaces/join/action",
    ]
    not_actions = []
  }

  assignable_scopes = [var.resource_group_id]
}

resource "azurerm_role_assignment" "adapter" {
  scope              = var.resource_group_id
  role_definition_id = azurerm_role_definition.adapter.role_definition_resource_id
  principal_id       = var.principal_id
}

# --- In the subscription: reads only -------------------------------------------------

resource "azurerm_role_definition" "adapter_subscription" {
  name        = "${var.name_prefix}-azure-adapter-reads"
  scope       = "/subscriptions/${var.subscription_id}"
  description = "Meridian's Azure site adapter: reads the compute resource SKUs and the compute operations it follows."

  permissions {
    actions = [
      "Microsoft.Compute/skus/read",
      "Microsoft.Compute/locations/operations/read",
    ]
    not_actions = []
  }

  assignable_scopes = ["/subscriptions/${var.subscription_id}"]
}

resource "azurerm_role_assignment" "adapter_subscription" {
  scope              = "/subscriptions/${var.subscription_id}"
  role_definition_id = azurerm_role_definition.adapter_subscription.role_definition_resource_id
  principal_id       = var.principal_id
}

# --- On the subnet -------------------------------------------------------------------

resource "azurerm_role_definition" "subnet_join" {
  name        = "${var.name_prefix}-azure-subnet-join"
  scope       = var.subnet_id
  description = "Meridian's Azure site adapter: puts its VMs' NICs in the site's subnet."

  permissions {
    actions = [
      "Microsoft.Network/virtualNetworks/subnets/join/action",
      "Microsoft.Network/virtualNetworks/subnets/read",
    ]
    not_actions = []
  }

  assignable_scopes = [var.subnet_id]
}

resource "azurerm_role_assignment" "subnet_join" {
  scope              = var.subnet_id
  role_definition_id = azurerm_role_definition.subnet_join.role_definition_resource_id
  principal_id       = var.principal_id
}

# --- On the custom images ------------------------------------------------------------

resource "azurerm_role_definition" "images" {
  count       = length(var.image_scopes) > 0 ? 1 : 0
  name        = "${var.name_prefix}-azure-image-read"
  scope       = "/subscriptions/${var.subscription_id}"
  description = "Meridian's Azure site adapter: reads the custom images its VMs boot from."

  permissions {
    actions = [
      "Microsoft.Compute/images/read",
      "Microsoft.Compute/galleries/read",
      "Microsoft.Compute/galleries/images/read",
      "Microsoft.Compute/galleries/images/versions/read",
    ]
    not_actions = []
  }

  assignable_scopes = var.image_scopes
}

resource "azurerm_role_assignment" "images" {
  for_each           = toset(var.image_scopes)
  scope              = each.value
  role_definition_id = azurerm_role_definition.images[0].role_definition_resource_id
  principal_id       = var.principal_id
}
