"""The vLLM worker: run as a folder (``python _vllm_worker``) in vLLM's own environment.

Not imported by posenc (its modules import vLLM); ``posenc.audit.vllm`` launches it. A
package so that wheels carry it.
"""
