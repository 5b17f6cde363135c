export PYTHONPATH=. CUCONV_CACHE_DIR=/tmp/cc HYPOTHESIS_PROFILE=gpu
python devtmp/prewarm.py
python -m pytest -q -x -m gpu tests/test_hopper.py tests/test_conv3d_native.py -p no:cacheprovider 2>&1 | tail -4
python devtmp/ppsweep.py
