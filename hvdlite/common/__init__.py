"""Framework-neutral parts of hvdlite: process control, errors, the request API."""
