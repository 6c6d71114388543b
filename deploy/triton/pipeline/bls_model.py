"""The `tensorrt_llm_bls` Triton model: preprocessing -> engine -> detokenization over BLS calls."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt
import triton_python_backend_utils as pb_utils

from deploy.triton import params
from deploy.triton.pipeline import bls_logic as bl
from deploy.triton.pipeline import tokenization as tk
from deploy.triton.pipeline.engine_client import EngineCallError, EngineClient, engine_url

logger = logging.getLogger(__name__)

Outputs = Mapping[str, npt.NDArray[Any]]
_PLACEHOLDERS = {
    "CUM_LOG_PROBS": np.zeros((1, 1), np.float32),
    "OUTPUT_LOG_PROBS": np.zeros((1, 1, 1), np.float32),
    "CONTEXT_LOGITS": np.zeros((1, 1, 1), np.float32),
    "GENERATION_LOGITS": np.zeros((1, 1, 1, 1), np.float32),
}


class StepError(RuntimeError):
    """An inner model answered with an error; the message names the model."""

    def __init__(self, model: str, message: str) -> None:
        super().__init__(f"{model}: {message}")


class EngineStepError(StepError):
    """The engine answered with an error; its request is over."""


class _Job:
    """One BLS request in flight, shared by its worker thread and the cancellation watcher."""

    def __init__(self, request: Any) -> None:
        self.request = request
        # Read while `execute` runs: Triton releases the request's buffers once it returns.
        self.inputs = {t.name(): np.array(t.as_numpy(), copy=True) for t in request.inputs()}
        self.requested = list(request.requested_output_names())
        self.inner_id = f"bls-{uuid.uuid4().hex}"
        self._lock = threading.Lock()
        self.cancelled = False
        self._engine_started = False
        self._stop_sent = False
        # Triton frees a request once its final flag is sent; asking it `is_cancelled()` then,
        # or while the flag is being sent, crashes tritonserver (seen with 2.51).
        self._final_guard = threading.Lock()
        self._final_sent = False

    def poll_cancelled(self) -> bool:
        """Whether the client cancelled; never asks Triton once the final flag is out."""
        with self._final_guard:
            return not self._final_sent and _is_cancelled(self.request)

    def send_final(self, sender: Any, response: Any = None) -> None:
        """Send the final flag (with the last response, if given); no polling after it."""
        with self._final_guard:
            self._final_sent = True
            if response is None:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def start_engine(self) -> bool:
        """Mark the engine request as sent; False when the job was cancelled before."""
        with self._lock:
            self._engine_started = not self.cancelled
            return self._engine_started

    def cancel(self) -> bool:
        """Mark the job cancelled; True when the engine must be told to stop."""
        with self._lock:
            first_time = not self.cancelled
            self.cancelled = True
            return first_time and self._engine_started

    def claim_stop(self) -> bool:
        """True exactly once: whoever gets it sends the stop request."""
        with self._lock:
            if self._stop_sent or not self._engine_started:
                return False
            self._stop_sent = True
            return True


class TritonPythonModel:
    """Our BLS: concurrent requests per instance, exact streaming text, stop words, cancellation.

    Each request runs on a worker thread, so one instance serves many requests at once (the
    stock BLS blocks an instance per request); a non-decoupled request gets its one response
    through its response sender (Triton 24.06+). Decoupled, the engine is streamed over the
    server's own gRPC endpoint (``engine_client`` says why). A watcher thread polls
    `is_cancelled()` and forwards cancellation to the engine as a stop request.
    """

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])

        def param(key: str, default: str) -> str:
            return params.parameter(config, key) or default

        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.accumulate = params.flag(
            params.parameter(config, "accumulate_tokens"), default=False, name="accumulate_tokens"
        )
        self.preprocessing = param("preprocessing_model_name", "preprocessing")
        self.engine = param("tensorrt_llm_model_name", "tensorrt_llm")
        self.postprocessing = param("postprocessing_model_name", "postprocessing")
        self.encoder = params.parameter(config, "multimodal_encoders_name")
        # Releases up to v0.8 make postprocessing require log-prob inputs it only passes along.
        self.postprocessing_extra = {
            name: _PLACEHOLDERS[name]
            for name in param("postprocessing_required_inputs", "").split(",")
            if name in _PLACEHOLDERS
        }
        self.poll_s = int(param("cancellation_check_period_ms", "100")) / 1000
        self.workers = ThreadPoolExecutor(
            max_workers=int(param("bls_max_concurrency", "256")), thread_name_prefix="bls"
        )
        self.stoppers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="bls-stop")
        self.jobs: dict[str, _Job] = {}
        self.jobs_lock = threading.Lock()
        self.engine_client = (
            EngineClient(engine_url(params.parameter(config, "engine_grpc_url")), self.engine)
            if self.decoupled
            else None
        )
        self.closing = threading.Event()
        self.watcher = threading.Thread(target=self._watch, name="bls-cancel", daemon=True)
        self.watcher.start()
        logger.info(
            "BLS ready: %s -> %s -> %s", self.preprocessing, self.engine, self.postprocessing
        )

    def execute(self, requests: list[Any]) -> None:
        serve = self._serve_stream if self.decoupled else self._serve_once
        for request in requests:
            job = _Job(request)
            with self.jobs_lock:
                self.jobs[job.inner_id] = job
            self.workers.submit(serve, job, request.get_response_sender())

    def finalize(self) -> None:
        # Triton unloads a decoupled model only after every request got its final response,
        # so nothing is in flight here; never let a stuck thread hold the unload.
        self.closing.set()
        self.workers.shutdown(wait=False, cancel_futures=True)
        self.stoppers.shutdown(wait=False, cancel_futures=True)
        self.watcher.join(timeout=5)
        if self.engine_client is not None:
            self.engine_client.close()

    def _serve_stream(self, job: _Job, sender: Any) -> None:
        try:
            for response in self._run(job):
                sender.send(response)
        except Exception as exc:
            _log_failure(exc)
            sender.send(_error_response(exc))
        finally:
            with self.jobs_lock:
                self.jobs.pop(job.inner_id, None)
            try:
                job.send_final(sender)
            except Exception:
                logger.exception("could not end the response stream of %s", job.inner_id)

    def _serve_once(self, job: _Job, sender: Any) -> None:
        """A non-decoupled request: exactly one response, the last one, sent final."""
        try:
            responses = list(self._run(job))
            last = responses[-1] if responses else pb_utils.InferenceResponse(output_tensors=[])
        except Exception as exc:
            _log_failure(exc)
            last = _error_response(exc)
        finally:
            with self.jobs_lock:
                self.jobs.pop(job.inner_id, None)
        try:
            job.send_final(sender, last)
        except Exception:
            logger.exception("could not send the response of %s", job.inner_id)

    def _watch(self) -> None:
        """Poll every job for cancellation; a cancelled one has its engine request stopped."""
        while not self.closing.wait(self.poll_s):
            with self.jobs_lock:
                jobs = list(self.jobs.values())
            for job in jobs:
                if not job.cancelled and job.poll_cancelled() and job.cancel():
                    self.stoppers.submit(self._stop_engine, job)

    def _stop_engine(self, job: _Job) -> None:
        """Send the engine a stop request under the inner request id; it answers with a final."""
        if not job.claim_stop():
            return
        inputs = {
            "input_ids": np.zeros((1, 1), np.int32),
            "input_lengths": np.zeros((1, 1), np.int32),
            "request_output_len": np.zeros((1, 1), np.int32),
            "stop": np.ones((1, 1), np.bool_),
        }
        try:
            for _ in self._engine_outputs(inputs, list(bl.ENGINE_ALWAYS), job.inner_id):
                pass
        except StepError as exc:
            logger.warning("stop request failed: %s", exc)
        except Exception:
            logger.exception("stop request for %s failed", job.inner_id)

    def _run(self, job: _Job) -> Iterator[Any]:
        plan = bl.plan_request(job.inputs, decoupled=self.decoupled, vision=bool(self.encoder))
        requested = job.requested
        preprocessed = self._call(
            self.preprocessing, plan.preprocessing_inputs, list(plan.preprocessing_outputs)
        )
        input_length = int(bl.first(preprocessed["REQUEST_INPUT_LEN"]))
        input_ids = preprocessed["INPUT_ID"][0, :input_length].tolist()
        engine_inputs = bl.engine_inputs(plan, preprocessed)
        encoder_inputs = bl.encoder_inputs(plan, preprocessed)
        if encoder_inputs is not None and self.encoder:
            encoded = self._call(self.encoder, encoder_inputs, list(bl.ENCODER_TO_ENGINE))
            engine_inputs = bl.with_prompt_table(engine_inputs, encoded)
        if not job.start_engine():
            return
        texts: dict[int, bl.SequenceText] = {}
        try:
            wanted = bl.engine_outputs(requested)
            for outputs in self._engine_outputs(engine_inputs, wanted, job.inner_id):
                if not job.cancelled:
                    yield from self._chunk(job, plan, texts, outputs, requested, input_ids)
        except EngineStepError:
            raise
        except BaseException:
            self._stop_engine(job)
            raise
        if plan.streaming and not job.cancelled:
            yield from self._flush(texts, requested)

    def _chunk(
        self,
        job: _Job,
        plan: bl.Dispatch,
        texts: dict[int, bl.SequenceText],
        outputs: Outputs,
        requested: list[str],
        input_ids: list[int],
    ) -> Iterator[Any]:
        """The response to one engine response, if any; stops the engine at a stop word."""
        index = int(bl.first(outputs.get("sequence_index"), 0))
        sequence = texts.setdefault(index, bl.SequenceText(self.accumulate, plan.stop_words))
        if sequence.stopped:
            return
        ids = outputs["output_ids"]
        if plan.streaming and (ids.ndim < 3 or ids.shape[1] == 1):
            chunk = [self._stream_text(sequence, outputs)]
        else:
            # A beam search streams every beam's tokens so far (beams change from step to
            # step): each response's texts are whole, as the stock BLS decodes them.
            chunk = self._whole_texts(plan, outputs, input_ids)
        yield _response(chunk, outputs, requested)
        if plan.streaming and sequence.stopped and _all_stopped(texts, plan.num_sequences):
            self._stop_engine(job)

    def _engine_outputs(
        self, inputs: dict[str, Any], outputs: list[str], request_id: str
    ) -> Iterator[Outputs]:
        """The engine's responses that carry tokens: streamed over gRPC where this model is
        decoupled, else the one response of an in-process call."""
        if self.engine_client is None:
            response = self._request(self.engine, inputs, outputs, request_id).exec()
            if response.has_error():
                raise EngineStepError(self.engine, response.error().message())
            streamed = iter([_as_arrays(response)])
        else:
            streamed = self.engine_client.stream(inputs, outputs, request_id)
        try:
            for arrays in streamed:
                if "output_ids" in arrays:
                    yield arrays
        except EngineCallError as exc:
            raise EngineStepError(self.engine, str(exc)) from None

    def _stream_text(self, sequence: bl.SequenceText, outputs: Outputs) -> str:
        ((ids,),) = tk.sequence_ids(outputs["output_ids"], outputs["sequence_length"])
        prefix, full = sequence.detokenizer.extend(ids)
        prefix_text, full_text = self._decode_windows(prefix, full)
        return sequence.emit(sequence.detokenizer.advance(prefix_text, full_text))

    def _whole_texts(self, plan: bl.Dispatch, outputs: Outputs, input_ids: list[int]) -> list[str]:
        (beams,) = tk.sequence_ids(outputs["output_ids"], outputs["sequence_length"])
        texts = self._decode(beams)
        if not plan.stop_words:
            return texts
        out = []
        for ids, text in zip(beams, texts, strict=True):
            start = 0
            if list(ids[: len(input_ids)]) == input_ids:
                (prompt_text,) = self._decode([input_ids])
                start = bl.prompt_text_length(ids, input_ids, prompt_text, text)
            out.append(bl.truncate_at_stop(text, plan.stop_words, start=start)[0])
        return out

    def _flush(self, texts: dict[int, bl.SequenceText], requested: list[str]) -> Iterator[Any]:
        for index, sequence in texts.items():
            if sequence.stopped or not sequence.detokenizer.pending:
                continue
            prefix, full = sequence.detokenizer.extend(())
            prefix_text, full_text = self._decode_windows(prefix, full)
            delta = sequence.detokenizer.advance(prefix_text, full_text, final=True)
            if delta:
                extra = {"sequence_index": np.array([[index]], np.int32)} if len(texts) > 1 else {}
                yield _response([sequence.emit(delta)], extra, requested)

    def _decode_windows(self, prefix: list[int], full: list[int]) -> tuple[str, str]:
        if not prefix:
            return "", self._decode([full])[0]
        prefix_text, full_text = self._decode([prefix, full])
        return prefix_text, full_text

    def _decode(self, sequences: Sequence[Sequence[int]]) -> list[str]:
        """Decode sequences in one postprocessing call, passed as the beams of one item."""
        width = max(1, *(len(ids) for ids in sequences))
        tokens = np.zeros((1, len(sequences), width), np.int32)
        for beam, ids in enumerate(sequences):
            tokens[0, beam, : len(ids)] = ids
        lengths = np.array([[len(ids) for ids in sequences]], np.int32)
        inputs = {"TOKENS_BATCH": tokens, "SEQUENCE_LENGTH": lengths, **self.postprocessing_extra}
        outputs = self._call(self.postprocessing, inputs, ["OUTPUT"])
        return [tk.as_text(text) for text in outputs["OUTPUT"].reshape(-1)]

    def _call(self, model: str, inputs: dict[str, Any], outputs: list[str]) -> Outputs:
        response = self._request(model, inputs, outputs, "").exec()
        if response.has_error():
            raise StepError(model, response.error().message())
        return _as_arrays(response)

    @staticmethod
    def _request(model: str, inputs: dict[str, Any], outputs: list[str], request_id: str) -> Any:
        return pb_utils.InferenceRequest(
            model_name=model,
            inputs=[pb_utils.Tensor(name, value) for name, value in inputs.items()],
            requested_output_names=outputs,
            request_id=request_id,
            preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0),
        )


def _is_cancelled(request: Any) -> bool:
    try:
        return bool(request.is_cancelled())
    except Exception:
        logger.debug("cancellation check failed", exc_info=True)
        return False


def _as_arrays(response: Any) -> Outputs:
    return {tensor.name(): tensor.as_numpy() for tensor in response.output_tensors()}


def _all_stopped(texts: dict[int, bl.SequenceText], expected: int) -> bool:
    return len(texts) >= expected and all(sequence.stopped for sequence in texts.values())


def _response(texts: list[str], outputs: Outputs, requested: list[str]) -> Any:
    tensors = []
    if bl.TEXT_OUTPUT in requested:
        tensors.append(pb_utils.Tensor(bl.TEXT_OUTPUT, tk.text_tensor([texts])))
    for name, value in outputs.items():
        if name in requested and name not in bl.ENGINE_ALWAYS:
            tensors.append(pb_utils.Tensor(name, value))
    return pb_utils.InferenceResponse(output_tensors=tensors)


def _error_response(exc: Exception) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc)))


def _log_failure(exc: Exception) -> None:
    if isinstance(exc, bl.RequestError | StepError):
        logger.warning("BLS request failed: %s", exc)
    else:
        logger.exception("BLS request failed")
