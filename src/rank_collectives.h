// The collectives of one tensor-parallel rank's model step (internal to src/): with tp 1 the
// all-reduce is nothing and the all-gather and reduce-scatter are copies, so the models' step code
// is the same at every tp.
#pragma once

#include "absl/status/status.h"
#include "eagle3/backend.h"
#include "eagle3/communicator.h"
#include "eagle3/tensor_view.h"

namespace eagle3 {

struct RankCollectives {
  int tp = 1;
  Communicator* comm = nullptr;  // may be null at tp 1
  Backend* backend = nullptr;

  absl::Status AllReduce(const TensorView& buf) const {
    return tp == 1 ? absl::OkStatus() : comm->AllReduceSum(buf, buf);
  }
  absl::Status AllGather(const TensorView& send, const TensorView& recv) const {
    return tp == 1 ? backend->Copy(send, recv) : comm->AllGather(send, recv);
  }
  absl::Status ReduceScatter(const TensorView& send, const TensorView& recv) const {
    return tp == 1 ? backend->Copy(send, recv) : comm->ReduceScatterSum(send, recv);
  }
};

}  // namespace eagle3
