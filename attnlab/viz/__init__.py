"""Pictures: training curves now; attention maps as the families land."""
