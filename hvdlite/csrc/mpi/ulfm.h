// Whether this MPI has the user-level fault mitigation interface (ULFM: Open MPI 5
// built with it, run with `--with-ft ulfm`): HVDLITE_HAVE_ULFM 1 or 0.
#pragma once

#include <mpi.h>

#if defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

#if defined(MPIX_ERR_PROC_FAILED) && defined(MPIX_ERR_REVOKED)
#define HVDLITE_HAVE_ULFM 1
#else
#define HVDLITE_HAVE_ULFM 0
#endif
