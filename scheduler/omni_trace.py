# ruff: noqa: E501
"""vllm-omni's public preemption trace (40 Qwen-Image requests, 512²–1536², 20–70 steps).

Verbatim copy of ``vllm_omni_mixed_t2i_preempt_trace.txt`` (public data from the vllm-omni
project, as provided in ../shared/workloads/), kept as a module so installs carry it.
"""

OMNI_PREEMPT_TRACE = """\
Request(request_id='req-0001', prompt='a cinematic city skyline at dawn', width=1536, height=1536, num_inference_steps=70)
Request(request_id='req-0002', prompt='a futuristic street market in rain', width=1536, height=1536, num_inference_steps=70)
Request(request_id='req-0003', prompt='a dragon flying over mountains', width=1344, height=1344, num_inference_steps=64)
Request(request_id='req-0004', prompt='a spaceship landing in desert', width=1344, height=1344, num_inference_steps=64)
Request(request_id='req-0005', prompt='a cup of coffee on wooden table', width=512, height=512, num_inference_steps=20)
Request(request_id='req-0006', prompt='a cat wearing sunglasses', width=512, height=512, num_inference_steps=20)
Request(request_id='req-0007', prompt='a plate of sushi close-up', width=512, height=512, num_inference_steps=20)
Request(request_id='req-0008', prompt='a bicycle parked near river', width=512, height=512, num_inference_steps=20)
Request(request_id='req-0009', prompt='a cozy bedroom with sunlight', width=640, height=640, num_inference_steps=24)
Request(request_id='req-0010', prompt='a fox in snowy forest', width=640, height=640, num_inference_steps=24)
Request(request_id='req-0011', prompt='a retro robot portrait', width=640, height=640, num_inference_steps=24)
Request(request_id='req-0012', prompt='a bakery storefront at night', width=640, height=640, num_inference_steps=24)
Request(request_id='req-0013', prompt='a person riding a horse', width=768, height=768, num_inference_steps=28)
Request(request_id='req-0014', prompt='a fantasy castle on cliff', width=768, height=768, num_inference_steps=28)
Request(request_id='req-0015', prompt='a bird sitting on branch', width=768, height=768, num_inference_steps=28)
Request(request_id='req-0016', prompt='a crowded subway station', width=768, height=768, num_inference_steps=28)
Request(request_id='req-0017', prompt='a mountain lake reflection', width=896, height=896, num_inference_steps=32)
Request(request_id='req-0018', prompt='a colorful coral reef', width=896, height=896, num_inference_steps=32)
Request(request_id='req-0019', prompt='a skateboard in urban park', width=896, height=896, num_inference_steps=32)
Request(request_id='req-0020', prompt='a night sky full of stars', width=896, height=896, num_inference_steps=32)
Request(request_id='req-0021', prompt='a minimal white chair product shot', width=512, height=512, num_inference_steps=20)
Request(request_id='req-0022', prompt='a watercolor style sunflower', width=512, height=512, num_inference_steps=20)
Request(request_id='req-0023', prompt='a ramen bowl on dark background', width=512, height=512, num_inference_steps=20)
Request(request_id='req-0024', prompt='a panda reading a newspaper', width=512, height=512, num_inference_steps=20)
Request(request_id='req-0025', prompt='a modern office lobby', width=640, height=640, num_inference_steps=24)
Request(request_id='req-0026', prompt='a lighthouse by the sea', width=640, height=640, num_inference_steps=24)
Request(request_id='req-0027', prompt='a steampunk airship', width=640, height=640, num_inference_steps=24)
Request(request_id='req-0028', prompt='a dancer on stage spotlight', width=640, height=640, num_inference_steps=24)
Request(request_id='req-0029', prompt='a forest cabin in autumn', width=768, height=768, num_inference_steps=28)
Request(request_id='req-0030', prompt='a classic muscle car', width=768, height=768, num_inference_steps=28)
Request(request_id='req-0031', prompt='a polar bear near icebergs', width=768, height=768, num_inference_steps=28)
Request(request_id='req-0032', prompt='a comic style superhero', width=768, height=768, num_inference_steps=28)
Request(request_id='req-0033', prompt='a marble statue in museum', width=896, height=896, num_inference_steps=32)
Request(request_id='req-0034', prompt='a rainy alley neon signs', width=896, height=896, num_inference_steps=32)
Request(request_id='req-0035', prompt='a violin on velvet cloth', width=896, height=896, num_inference_steps=32)
Request(request_id='req-0036', prompt='a hot air balloon festival', width=896, height=896, num_inference_steps=32)
Request(request_id='req-0037', prompt='a red apple on white plate', width=512, height=512, num_inference_steps=20)
Request(request_id='req-0038', prompt='a surfer on giant wave', width=1024, height=1024, num_inference_steps=40)
Request(request_id='req-0039', prompt='a cinematic samurai portrait', width=1024, height=1024, num_inference_steps=40)
Request(request_id='req-0040', prompt='a glowing jellyfish underwater', width=512, height=512, num_inference_steps=20)
"""
