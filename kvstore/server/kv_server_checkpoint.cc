// KVServerStore's checkpoints (docs/kvstore.md, "Checkpoints"): each server writes the slices
// it serves to a file of its own; a load reads every slice from the files and changes the
// slices of every server or of none (kv::LoadStep).
#include <algorithm>
#include <new>
#include <utility>

#include "kvstore/checkpoint.h"
#include "kvstore/server/kv_server.h"

namespace ps {

std::string KVServerStore::RoundInProgress() const {
  for (const auto& [id, slice] : slices_) {
    if (slice.updating()) {
      return KeyText(id.first) +
             " has a dist_sync round in progress: every worker must finish its "
             "pushes (WaitAll) before a checkpoint";
    }
  }
  return "";
}

void KVServerStore::HandleSave(const Meta& meta, const kv::Request& request) {
  const std::string server = "server " + std::to_string(runtime_.rank());
  if (const std::string busy = RoundInProgress(); !busy.empty()) {
    runtime_.ReplyError(meta, server + ": " + busy);
    return;
  }
  const std::string name = checkpoint::DataFileName(runtime_.rank(), runtime_.num_servers());
  const std::string path = request.path + "/" + name;
  Runtime::SlowWork work = runtime_.BeginSlowWork("writing checkpoint file " + path);
  // Written slice by slice from the slices themselves: nothing changes them meanwhile (this
  // thread applies every update, and no round is in progress), and the save needs no copy of
  // what the server holds, only of one slice's optimizer state at a time.
  std::uint64_t records = 0;
  for (const auto& [id, slice] : slices_) records += Serves(slice) ? 1 : 0;
  checkpoint::FileSummary written;
  try {
    checkpoint::DataFileWriter writer(
        request.path, runtime_.rank(), runtime_.num_servers(),
        optimizer_ ? std::optional(optimizer_->config()) : std::nullopt, records,
        [&work] { work.Progress(); });
    for (const auto& [id, slice] : slices_) {
      if (!Serves(slice)) continue;  // a replica's copy: its primary writes it
      checkpoint::RecordView record;
      record.key = id.first;
      record.offset = id.second;
      record.total = slice.total;
      record.dtype = slice.dtype;
      record.value = {slice.value.data(), slice.value.bytes()};
      std::optional<Optimizer::SavedState> state;
      if (optimizer_) state = optimizer_->ExportState(slice.state_id);
      if (state) {
        record.count = state->count;
        record.buffers = static_cast<std::uint32_t>(optimizer_->num_buffers());
        record.state = state->buffers;
      }
      writer.Add(record);
    }
    written = writer.Commit();
  } catch (const Error& e) {
    runtime_.ReplyError(meta, server + ": " + e.what());
    return;
  } catch (const std::bad_alloc&) {
    // The save fails, as with a full disk; the server, its values and the job go on.
    runtime_.ReplyError(meta, server + ": out of memory while saving checkpoint file " + path +
                                  ": a save copies one slice's optimizer state at a time, and "
                                  "could not allocate that; nothing was written (give the "
                                  "server more memory, or spread the keys over more servers)");
    return;
  }
  // The reply tells worker 0 what the MANIFEST must say of this file, and how many slices it
  // holds (all the servers' files must hold every slice of every key once).
  const std::vector<std::uint64_t> summary{written.bytes, written.checksum, records};
  Message reply;
  reply.data.push_back(
      Blob::Copy(summary.data(), summary.size() * sizeof(std::uint64_t), DType::kUInt64));
  runtime_.Reply(meta, std::move(reply));
}

void KVServerStore::HandleLoad(const Meta& meta, const kv::Request& request) {
  switch (request.load_step) {
    case kv::LoadStep::kStage:
      StageLoad(meta, request);
      return;
    case kv::LoadStep::kApply:
      ApplyLoad(meta, request);
      return;
    case kv::LoadStep::kDiscard:
      staged_load_.reset();
      runtime_.Reply(meta, Message{});
      return;
  }
}

void KVServerStore::StageLoad(const Meta& meta, const kv::Request& request) {
  const std::string server = "server " + std::to_string(runtime_.rank());
  staged_load_.reset();  // an earlier load's, never applied
  if (const std::string busy = RoundInProgress(); !busy.empty()) {
    runtime_.ReplyError(meta, server + ": " + busy);
    return;
  }
  // Everything is read, checked and assembled; no slice changes before ApplyLoad.
  StagedLoad staged{request.path, {}};
  Runtime::SlowWork work = runtime_.BeginSlowWork("loading checkpoint " + request.path);
  try {
    const auto manifest = checkpoint::Manifest::Parse(request.manifest, request.path + "/MANIFEST");
    checkpoint::Index index;
    const int servers = runtime_.num_servers();
    // Same servers without replication: this server's own file has its slices, unless the
    // key layout changed (other server weights, bound or chunk). Otherwise they are spread
    // over the files (a replica's copies are in its primary's; after a server died, the
    // survivors' files have the layout of the job that wrote them, not of their count).
    const auto rank = static_cast<std::size_t>(runtime_.rank());
    bool own_file = manifest.servers == servers && !runtime_.config().replicated() &&
                    manifest.files[rank].name == checkpoint::DataFileName(runtime_.rank(), servers);
    const auto read = [&](const checkpoint::FileSummary& file) {
      work.Doing("reading checkpoint file " + request.path + "/" + file.name);
      return checkpoint::ReadDataFile(request.path, file, [&work] { work.Progress(); });
    };
    if (own_file) {
      index.Add(read(manifest.files[rank]));
      own_file = std::all_of(slices_.begin(), slices_.end(), [&](const auto& entry) {
        return index.Covers(entry.first.first, entry.first.second, entry.second.length);
      });
    }
    if (!own_file) {
      index = checkpoint::Index();
      for (const auto& file : manifest.files) index.Add(read(file));
    }
    // The keys and their sizes first: a checkpoint of another model is named as such, whatever
    // the optimizer.
    work.Doing("loading checkpoint " + request.path + " (assembling the slices)");
    for (const auto& [id, slice] : slices_) {
      work.Progress();
      staged.slices.emplace(
          id, index.Assemble(id.first, id.second, slice.length, slice.total, slice.dtype));
    }
    // A server holding nothing (one that took a dead one's rank and was sent no copy yet, so
    // no settings either) has no state to load.
    if (!slices_.empty()) {
      checkpoint::CheckOptimizerMatches(index.optimizer(),
                                        optimizer_ ? &optimizer_->config() : nullptr);
    }
    for (const auto& [id, assembled] : staged.slices) {
      checkpoint::CheckStateFits(id.first, assembled, optimizer_.get());
    }
  } catch (const Error& e) {
    runtime_.ReplyError(meta, server + ": " + e.what(), e.kind());
    return;
  } catch (const std::bad_alloc&) {
    // The load fails on every worker and changes nothing, as with a corrupt file.
    runtime_.ReplyError(meta, server + ": out of memory while loading checkpoint " + request.path +
                                  ": a load reads the files and assembles the slices this "
                                  "server holds before changing any; nothing was changed (give "
                                  "the server as much memory again as it holds, or spread the "
                                  "keys over more servers)");
    return;
  }
  staged_load_ = std::move(staged);
  runtime_.Reply(meta, Message{});
}

void KVServerStore::ApplyLoad(const Meta& meta, const kv::Request& request) {
  const std::string server = "server " + std::to_string(runtime_.rank());
  // A server that died or joined since the stage dropped what this server staged (the slices
  // it serves may differ now), as did one that held nothing then: nothing changes here, and
  // worker 0 runs the whole load again once it heard of the change (a replica's copy that
  // missed the load gets its primary's value below).
  std::optional<StagedLoad> staged = std::exchange(staged_load_, std::nullopt);
  const bool holds_any = !slices_.empty();
  if ((!staged && holds_any) || (staged && staged->path != request.path)) {
    runtime_.ReplyError(meta, server + ": servers died or joined since it read " + request.path +
                                  ": the load runs again on the servers as they are now");
    return;
  }
  for (const auto& [id, slice] : slices_) {
    if (!Serves(slice) || staged->slices.count(id)) continue;
    runtime_.ReplyError(meta, server + ": " + KeyText(id.first) + ": not read from " +
                                  request.path +
                                  " (the server came to serve it after the load began)");
    return;
  }
  std::vector<Slice*> served;
  if (staged) {  // else this server holds nothing
    for (auto& [id, assembled] : staged->slices) {
      const auto it = slices_.find(id);
      if (it == slices_.end()) continue;  // dropped meanwhile: nothing to load into
      Slice& slice = it->second;
      slice.value = Blob::FromVector(std::move(assembled.value), slice.dtype);
      // The workers' copies are of the value before: a compressed pull would send the change
      // since them, coarsely; the next pull of each worker goes in full.
      slice.mirrors.clear();
      if (optimizer_ && (assembled.count > 0 || !assembled.state.empty())) {
        optimizer_->ImportState(slice.state_id,
                                {slice.length, assembled.count, std::move(assembled.state)});
      }
      if (Serves(slice)) served.push_back(&slice);
    }
  }
  if (replica_node_ == kNoNode || served.empty()) {
    runtime_.Reply(meta, Message{});
    return;
  }
  // Answered once every replica holds what was loaded: a replica reads the files itself, but a
  // copy of the old values on its way after a failover could overwrite what it read.
  Pending& pending = NewPending(meta, served.size());
  for (std::size_t j = 0; j < served.size(); ++j) {
    Forward copy;
    copy.kind = kv::ReplicaKind::kState;
    copy.waiters.push_back(Waiter{&pending, j});
    StartForward(*served[j], std::move(copy));
  }
}

}  // namespace ps
