export PYTHONPATH=. CUCONV_CACHE_DIR=/tmp/cc HYPOTHESIS_PROFILE=gpu
timeout 100 python devtmp/prewarm.py
timeout 60 python -m pytest -q -x -m gpu tests/test_hopper.py -k pingpong -p no:cacheprovider > $OUT/pp_tests.log 2>&1; echo "pp tests rc=$?"; tail -3 $OUT/pp_tests.log
timeout 150 python -m pytest -q -x -m gpu tests/test_hopper.py tests/test_conv3d_native.py -p no:cacheprovider > $OUT/tests.log 2>&1; echo "tests rc=$?"; tail -3 $OUT/tests.log
timeout 150 python devtmp/ppsweep.py 2>&1 | tee $OUT/ppsweep.log
