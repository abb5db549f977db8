output "adapter_role_id" {
  description = "The resource group role's id (VMs, NICs, OS disks)."
  value       = azurerm_role_definition.adapter.role_definition_resource_id
}
