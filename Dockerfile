# dpaudit on a CUDA PyTorch base. The base image already carries a CUDA build of torch and a
# matching torchvision, so the install below (the README's, with the vision and launcher
# extras) keeps them and adds dpaudit and the rest of pyproject's dependencies.
#   docker build -t dpaudit .
#   docker run --gpus all --rm -v "$PWD/outputs:/work/outputs" dpaudit            # default audit
#   docker run --rm dpaudit experiment=stats_demo                                 # CPU works too
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

WORKDIR /opt/dpaudit
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir ".[vision,launchers]" && python -c "import dpaudit, torchvision"

WORKDIR /work
ENTRYPOINT ["dpaudit"]
