# dpaudit on a CUDA PyTorch base whose torch and torchvision satisfy opacus 1.6 (torch>=2.6):
# the image installs the Docker lock (requirements/docker.txt, the same versions CI tests, with
# torch==2.13.0 / torchvision==0.28.0, which the base's 2.13.0+cu130 builds satisfy), so pip
# keeps the base image's torch and torchvision; the build fails if they changed anyway.
# `.ci/check_docker_torch` (run by CI, no Docker needed) checks the same by a pip dry run.
#   docker build -t dpaudit .
#   docker run --gpus all --rm -v "$PWD/outputs:/work/outputs" dpaudit            # default audit
#   docker run --rm dpaudit experiment=stats_demo                                 # CPU works too
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime
FROM ${BASE_IMAGE}

WORKDIR /opt/dpaudit
COPY requirements/docker.txt requirements/docker.txt
RUN python -c "import torch, torchvision; print(torch.__version__, torchvision.__version__)" > /tmp/base-torch \
 && pip install --no-cache-dir -r requirements/docker.txt \
 && python -c "import torch, torchvision; print(torch.__version__, torchvision.__version__)" > /tmp/after-torch \
 && diff /tmp/base-torch /tmp/after-torch
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir --no-deps . && python -c "import dpaudit, torchvision, mlxtend, ray, hydra_plugins.hydra_ray_launcher" && dpaudit --cfg job > /dev/null

WORKDIR /work
ENTRYPOINT ["dpaudit"]
