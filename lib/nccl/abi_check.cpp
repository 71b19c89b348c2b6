// Compiled only where nccl.h exists: our hand-written declarations in library.hpp and
// unique_id.hpp must match the header's, or the build stops here rather than at run time.
#include "nccl/library.hpp"

#include <nccl.h>

#include <type_traits>

namespace ddp::nccl {

static_assert(sizeof(ncclUniqueId) == kUniqueIdBytes);
static_assert(sizeof(RawUniqueId) == sizeof(ncclUniqueId));
static_assert(std::is_same_v<ncclComm_t, RawComm>);
static_assert(static_cast<int>(Result::success) == ncclSuccess);
static_assert(static_cast<int>(Result::unhandled_cuda_error) == ncclUnhandledCudaError);
static_assert(static_cast<int>(Result::system_error) == ncclSystemError);
static_assert(static_cast<int>(Result::internal_error) == ncclInternalError);
static_assert(static_cast<int>(Result::invalid_argument) == ncclInvalidArgument);
static_assert(static_cast<int>(Result::invalid_usage) == ncclInvalidUsage);
static_assert(static_cast<int>(Result::remote_error) == ncclRemoteError);
static_assert(static_cast<int>(Result::in_progress) == ncclInProgress);
static_assert(static_cast<int>(DataType::int32) == ncclInt32);
static_assert(static_cast<int>(DataType::float32) == ncclFloat32);
static_assert(static_cast<int>(RedOp::sum) == ncclSum);
static_assert(sizeof(ncclResult_t) == sizeof(int));
static_assert(sizeof(ncclDataType_t) == sizeof(int) && sizeof(ncclRedOp_t) == sizeof(int));

}  // namespace ddp::nccl
